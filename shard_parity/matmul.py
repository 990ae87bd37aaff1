"""The one matrix product both models use, with a backward that XLA partitions well.

`x @ w` contracts x's last dimension with a weight: a Linear's kernel [K, N], or the embedding
table [N, K] when it doubles as the output head (`transposed`). JAX's own backward forms the
weight gradient transposed ([N, K] for a kernel) and transposes it back. In one program XLA
folds that transpose into the matmul; in auto/'s data-parallel step it cannot, because the
partitioner puts the gradient all-reduce between the two, and every weight gradient was then
transposed and copied each step: auto ran at 0.66x explicit's speed for the MLP (benchmarks).
Here the backward forms each gradient in its weight's own layout, in one matmul over the
flattened rows, and both twins run the same instructions.
"""

import functools

import jax


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul(x, w, transposed: bool = False):
    """x[..., K] @ w[K, N] -> [..., N]; with `transposed`, x[..., K] @ w[N, K]^T."""
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (1 if transposed else 0,)), ((), ())))


def _fwd(x, w, transposed):
    return matmul(x, w, transposed), (x, w)


def _bwd(transposed, saved, g):  # g: [..., N]
    x, w = saved
    dx = jax.lax.dot_general(g, w, (((g.ndim - 1,), (0 if transposed else 1,)), ((), ())))
    # Sum over every row (batch, position): flattened into one dimension, which XLA:CPU's
    # matmul takes as it is (with two or more it transposes the activations first).
    x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    rows = (((0,), (0,)), ((), ()))
    dw = jax.lax.dot_general(g2, x2, rows) if transposed else jax.lax.dot_general(x2, g2, rows)
    return dx, dw  # dw: [N, K] or [K, N], as w


matmul.defvjp(_fwd, _bwd)


def dot_general(x, w, dimension_numbers, precision=None, **kwargs):
    """nnx.Linear's `dot_general=` hook: its one contraction, through `matmul`."""
    assert dimension_numbers == (((x.ndim - 1,), (0,)), ((), ())), dimension_numbers
    return product(x, w)


def product(x, w, transposed: bool = False):
    """`matmul`, after giving both operands the same varying mesh axes inside shard_map, as
    JAX's own dot_general does implicitly: a custom backward must return gradients of its
    operands' own types. Under explicit tensor parallelism the cast of the (model-invariant)
    input then transposes into the psum of its gradient."""
    return matmul(vary_like(x, w), vary_like(w, x), transposed)


def varying(x) -> frozenset:
    """The mesh axes along which x varies inside shard_map (none outside it). jax 0.10 spells
    this `manual_axis_type.varying`; earlier releases, `.vma`."""
    t = jax.typeof(x)
    return t.manual_axis_type.varying if hasattr(t, 'manual_axis_type') else t.vma


def vary_like(a, b):
    """`a`, cast to varying over the mesh axes along which `b` varies and `a` does not."""
    axes = tuple(sorted(varying(b) - varying(a)))
    return jax.lax.pcast(a, axes, to='varying') if axes else a
