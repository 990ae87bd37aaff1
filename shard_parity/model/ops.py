"""The model's custom-backward operations: the matrix product, GELU and LayerNorm.

Each computes what JAX's own operation computes (to float32 round-off, values and gradients:
parity_tests/test_matmul.py, test_layers.py) with a hand-written backward, for one reason each:

- `matmul` (every Linear layer, and the output head tied to the embedding): JAX's own backward
  forms a weight gradient transposed ([N, K] for a kernel [K, N]) and transposes it back. In one
  program XLA folds that transpose into the matmul; in auto/'s data-parallel step it cannot,
  because the partitioner puts the gradient all-reduce between the two, so every weight gradient
  was transposed and copied each step and auto ran well behind explicit on the MLP. Here the
  backward forms each gradient in its weight's own layout, in one matmul over the flattened rows,
  and both twins run the same instructions.
- `gelu`: `jax.nn.gelu(approximate=False)` goes through `erfc`, which XLA:CPU evaluates with a
  branch and an `exp`, and autodiff evaluates it again in the backward; with fused multiply-adds
  off (the CPU default here, shard_parity/devices.py) XLA's own `erf` is about 12x slower than with
  them. Here `erf` is a rational polynomial of plain multiplies and adds, and the backward reuses
  the forward's Phi(x).
- `layer_norm`: autodiff's backward materialises broadcasts of the statistics; the closed form
  reads the normalised input once.

Inside shard_map a custom backward must return each gradient with its operand's own type, so
`vary_like` first gives both operands the same varying mesh axes, as JAX's own ops do
implicitly; under explicit tensor parallelism that cast of a model-invariant input transposes
into the psum of its gradient. GELU and LayerNorm compute in float32 (float64 for float64 inputs) and return the input's
dtype; in bfloat16 LayerNorm multiplies its scale in float32 where nnx.LayerNorm rounds it to
bfloat16 first. What each saved is measured in docs/benchmarks.md.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def matmul(x, w, transposed: bool = False, out=None, grad=None):
    """x[..., K] @ w[K, N] -> [..., N]; with `transposed`, x[..., K] @ w[N, K]^T. `out`: the
    product's element type, `grad`: the weight gradient's (the dots accumulate in float32
    either way); None keeps the operands' (the precision policy: the head asks float32 logits
    of bfloat16 operands, and the weight gradient comes out in --reduce_dtype, which is what
    the compiler's all-reduce of it then carries in auto/ and typed/)."""
    return _dot(x, w, transposed, out)


def _dot(x, w, transposed, out):
    """matmul's one dot_general, called by the forward rule itself (not through matmul): a
    plain dot_general in the differentiated program is what --remat_policy=dots saves."""
    dims = (((x.ndim - 1,), (1 if transposed else 0,)), ((), ()))
    partials, dtype = typed_partials(x, w, transposed), other(out, x)
    return jax.lax.dot_general(x, w, dims, out_sharding=partials, preferred_element_type=dtype)


def other(dtype, x):
    """`dtype` where it is not x's own (a dot's preferred_element_type), else None: a float32
    step's program is what it was before the policy."""
    return None if dtype is None or jnp.dtype(dtype) == x.dtype else jnp.dtype(dtype)


def _fwd(x, w, transposed, out, grad):
    return _dot(x, w, transposed, out), (x, w)


def _bwd(transposed, out, grad, saved, g):  # g: [..., N]
    x, w = saved
    g = g.astype(x.dtype)  # float32 logits' gradient back into the bfloat16 layers
    dx = jax.lax.dot_general(
        g, w, (((g.ndim - 1,), (0 if transposed else 1,)), ((), ())), out_sharding=typed_ct(x)
    )
    # Sum over every row (batch, position): flattened into one dimension, which XLA:CPU's
    # matmul takes as it is (with two or more it transposes the activations first). Not in
    # Explicit mode: jax's reshape has no sharding rule for a `reduced` g (a row-parallel
    # layer's, jax 0.10 to 0.12), so there the dot contracts the leading dimensions as they are.
    lead = tuple(range(x.ndim - 1))
    if typed(x) is None:
        x, g, lead = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1]), (0,)
    rows, where = ((lead, lead), ((), ())), typed_ct(w)
    dw = jax.lax.dot_general(
        *((g, x) if transposed else (x, g)), rows, out_sharding=where,
        preferred_element_type=other(grad, x),
    )  # fmt: skip
    # dw: [N, K] or [K, N], as w; float32 (as formed, in `grad`) where w is a bfloat16 copy:
    # rounded to it first, XLA may reduce it over devices in bfloat16 (the policy's reduce)
    return dx, dw.astype(jnp.promote_types(w.dtype, dw.dtype))


matmul.defvjp(_fwd, _bwd)


@dataclasses.dataclass(frozen=True)
class Dot:
    """nnx.Linear's `dot_general=` hook: its one contraction, through `matmul`, the weight
    gradient formed in `grad` (the policy's reduce dtype; None: the operands'). `logits`: the
    model's head, whose product comes out in float32 (float64 under x64) whatever the compute
    dtype, for the softmax and the loss."""

    grad: str | None = None
    logits: bool = False

    def __call__(self, x, w, dimension_numbers, precision=None, **kwargs):
        assert dimension_numbers == (((x.ndim - 1,), (0,)), ((), ())), dimension_numbers
        return product(x, w, out=wide(x.dtype) if self.logits else None, grad=self.grad)


dot_general = Dot()  # the weight gradient in the operands' dtype


def product(x, w, transposed: bool = False, out=None, grad=None):
    """`matmul`, after giving both operands the same varying mesh axes inside shard_map, as
    JAX's own dot_general does implicitly: a custom backward must return gradients of its
    operands' own types. Under explicit tensor parallelism the cast of the (model-invariant)
    input then transposes into the psum of its gradient."""
    return matmul(vary_like(x, w), vary_like(w, x), transposed, out, grad)


def varying(x) -> frozenset:
    """The mesh axes along which x varies inside shard_map (none outside it). jax 0.10 spells
    this `manual_axis_type.varying`; earlier releases, `.vma`."""
    t = jax.typeof(x)
    return t.manual_axis_type.varying if hasattr(t, 'manual_axis_type') else t.vma


def vary_like(a, b):
    """`a`, cast to varying over the mesh axes along which `b` varies and `a` does not."""
    axes = tuple(sorted(varying(b) - varying(a)))
    return jax.lax.pcast(a, axes, to='varying') if axes else a


# --- JAX's Explicit mode (typed/), where every array's sharding is part of its type ---


def typed(x):
    """x's sharding where it is part of x's type (a mesh with Explicit axes: the typed/ twin);
    None in Auto mode and inside shard_map, where every call below then runs as it always has."""
    sharding = jax.typeof(x).sharding
    mesh = getattr(sharding, 'mesh', None)
    return sharding if mesh is not None and AxisType.Explicit in mesh.axis_types else None


def typed_ct(x):
    """The sharding of x's gradient: x's own, with `reduced` and `unreduced` swapped (a weight
    made `reduced` over 'data' gets an `unreduced` gradient: partial sums, one per device, that
    the strategy reduces once). Explicit mode needs it said wherever a dot contracts a sharded
    dimension, as every weight gradient's does (the batch's rows); None elsewhere."""
    sharding = typed(x)
    if sharding is None:
        return None
    spec = sharding.spec
    return NamedSharding(
        sharding.mesh, P(*spec.partitions, unreduced=spec.reduced, reduced=spec.unreduced)
    )


def partitions(x, sharding) -> tuple:
    """x's `sharding` spec, one entry per dimension (None for the trailing ones it omits)."""
    return sharding.spec.partitions + (None,) * (x.ndim - len(sharding.spec.partitions))


def whole(x, axis: int):
    """x with dimension `axis` unsplit, in Explicit mode (a reshard); elsewhere x itself."""
    sharding = typed(x)
    if sharding is None or partitions(x, sharding)[axis] is None:
        return x
    spec = list(partitions(x, sharding))
    spec[axis] = None
    return jax.reshard(x, NamedSharding(sharding.mesh, P(*spec)))


def typed_partials(x, w, transposed: bool):
    """In Explicit mode, a product whose contracted dimension is split (a row-parallel layer:
    x[..., K@model] @ w[K@model, N]) comes out `unreduced` over that axis: each device's partial
    sum, which the strategy's `sum_partials` adds (typed/tp.py). None where nothing is split.
    A stacked w[E, K, N] (the experts', shard_parity/model/moe.py) keeps x's leading dimensions."""
    sx, sw = typed(x), typed(w)
    if sx is None or sw is None:
        return None
    xs, ws = partitions(x, sx), partitions(w, sw)
    split = xs[-1]
    if split is None:
        return None
    axes = frozenset(split if isinstance(split, tuple) else (split,))
    dims = (*xs[:-1], ws[-2 if transposed else -1])
    return NamedSharding(sx.mesh, P(*dims, unreduced=axes))


def split(x, axis: int, sizes):
    """x with dimension `axis` split into `sizes` (one may be -1). In Explicit mode that
    dimension's split goes to the first of them, as tensor parallelism means it (heads, then
    key-value heads): JAX's reshape rule skips a dimension of size 1, so with one (key-value)
    head on a 'model' axis of 1 it split the head's features, and the attention's einsums then
    met 'model' twice (fuzzer, 2026-12-05). Elsewhere a plain reshape."""
    sizes = list(sizes)
    if -1 in sizes:
        known = math.prod(n for n in sizes if n != -1)
        sizes[sizes.index(-1)] = x.shape[axis] // known
    shape = (*x.shape[:axis], *sizes, *x.shape[axis + 1 :])
    sharding = typed(x)
    if sharding is None:
        return x.reshape(shape)
    spec = partitions(x, sharding)
    out = (*spec[:axis], spec[axis], *(None,) * (len(sizes) - 1), *spec[axis + 1 :])
    return jax.lax.reshape(x, shape, out_sharding=NamedSharding(sharding.mesh, P(*out)))


def merge(x, axis: int, count: int):
    """x with dimensions axis .. axis+count-1 merged into one, whose split is the first's in
    Explicit mode (split's inverse; JAX's rule drops a split on a dimension of size 1)."""
    shape = (*x.shape[:axis], math.prod(x.shape[axis : axis + count]), *x.shape[axis + count :])
    sharding = typed(x)
    if sharding is None:
        return x.reshape(shape)
    spec = partitions(x, sharding)
    out = (*spec[: axis + 1], *spec[axis + count :])
    return jax.lax.reshape(x, shape, out_sharding=NamedSharding(sharding.mesh, P(*out)))


def lookup(embed: nnx.Embed, ids, shape=None):
    """embed(ids): rows of the table, [*ids.shape, C] in the compute dtype. The rows are taken
    from the float32 table and then cast (nnx.Embed casts the whole table first), so that the
    table's gradient, a scatter-add of the rows', adds in float32 (the precision policy; in
    float32 the same program as embed(ids)). `shape`: the rows broadcast to it before the cast
    (the positions' [T, C] to the batch's [B, T, C]), so that the sum of their gradient over
    the rows, which the batch axes' devices then reduce, is float32 too. In Explicit mode
    `jnp.take` has no sharding rule for a table indexed by a split array of ids (jax#28111), so
    the gather says its output's sharding itself: the ids', with the features whole."""
    table, sharding = embed.embedding[...], typed(ids)
    dtype = embed.dtype or table.dtype
    if sharding is None:
        rows = jnp.take(table, ids, axis=0)
    else:
        out = NamedSharding(sharding.mesh, P(*sharding.spec.partitions, None))
        rows = gather_in_mesh(table, ids, out)
    return (rows if shape is None else jnp.broadcast_to(rows, shape)).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def gather_in_mesh(table, ids, out):
    """table.at[ids].get(out_sharding=out), its gradient JAX's own (a scatter-add into zeros)
    formed with `out`'s mesh as the context mesh. The twins' steps set none, and jax 0.12.1
    makes those zeros in the context's mesh: a `reduced` table's gradient then lost its
    `unreduced` type (`ShardingTypeError: When out_sharding is specified on scatter_add, operand
    must be unreduced along the same axes as out_sharding`; tools/upstream/, D). Where JAX's own
    gradient works (jax 0.10.2, 0.12.0.1) XLA compiles the same program with or without this."""
    return table.at[ids].get(out_sharding=out)


def _gather_fwd(table, ids, out):
    return gather_in_mesh(table, ids, out), (table, ids)


def _gather_bwd(out, residuals, grad):
    table, ids = residuals
    with jax.sharding.use_abstract_mesh(out.mesh.abstract_mesh):
        _, pullback = jax.vjp(lambda t: t.at[ids].get(out_sharding=out), table)
        return pullback(grad)[0], None  # the ids (integers) have no gradient


gather_in_mesh.defvjp(_gather_fwd, _gather_bwd)


def cross_entropy(logits, labels):
    """optax.softmax_cross_entropy_with_integer_labels(logits, labels) over the last axis. In
    Explicit mode the same arithmetic with each label's logit picked by a one-hot product
    (exact: every other term is a zero), which shards as its operands do: optax's
    `.take(0, axis)` has a transpose (a scatter) with no sharding rule in jax 0.12 (jax#33787),
    `take_along_axis`'s has none where a split dimension has size 1 (typed cp at batch 1 on
    'data':1), and a gather that states its output's sharding made XLA all-gather the indices
    (and permute them) in every typed step."""
    if typed(logits) is None:
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    one_hot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
    label_logits = jnp.sum(logits * one_hot, axis=-1)
    return jax.nn.logsumexp(logits, axis=-1) - label_logits


# --- GELU and LayerNorm ---


def wide(dtype):
    """The dtype GELU, LayerNorm and softmax compute in: float64 for float64 inputs (the
    bisector's --x64), float32 for everything else (float32, bfloat16)."""
    return jnp.float64 if jnp.dtype(dtype) == jnp.float64 else jnp.float32


# erf(x) ~ x * P(x^2) / Q(x^2) on [-4, 4] and +-1 beyond: the float32 rational approximation
# of Eigen's generic_fast_erf_float. Within 4.5e-7 of the true erf (test_layers.py measures it).
_ERF_P = (
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
)
_ERF_Q = (
    -1.45660718464996e-05,
    -2.13374055278905e-04,
    -1.68282697438203e-03,
    -7.37332916720468e-03,
    -1.42647390514189e-02,
)
_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def erf(x):
    """float32 erf from multiplies, adds and one divide (Horner's rule)."""
    x = jnp.clip(x, -4.0, 4.0)
    x2 = x * x
    p, q = _ERF_P[0], _ERF_Q[0]
    for c in _ERF_P[1:]:
        p = p * x2 + c
    for c in _ERF_Q[1:]:
        q = q * x2 + c
    return x * p / q


def _cdf(x):  # Φ(x), the standard normal CDF
    return 0.5 * (1.0 + erf(x * _SQRT_HALF))


@jax.custom_vjp
def gelu(x):
    """Exact GELU, x * Φ(x), as nanoGPT's nn.GELU() (not the tanh approximation)."""
    return _gelu_fwd(x)[0]


def _gelu_fwd(x):
    x32 = x.astype(wide(x.dtype))
    cdf = _cdf(x32)
    return (x32 * cdf).astype(x.dtype), (x32, cdf)


def _gelu_bwd(saved, g):  # d/dx x Φ(x) = Φ(x) + x φ(x)
    x, cdf = saved
    pdf = jnp.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return ((g.astype(x.dtype) * (cdf + x * pdf)).astype(g.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def layer_norm(x, scale, epsilon: float):
    """(x - mean) / sqrt(var + epsilon) * scale over the last axis; no bias."""
    return _layer_norm_fwd(x, scale, epsilon)[0]


def _layer_norm_fwd(x, scale, epsilon):
    x32 = x.astype(wide(x.dtype))
    centred = x32 - x32.mean(-1, keepdims=True)
    inv_std = jax.lax.rsqrt((centred * centred).mean(-1, keepdims=True) + epsilon)
    normed = centred * inv_std
    return (normed * scale).astype(x.dtype), (normed, inv_std, scale)


def _layer_norm_bwd(epsilon, saved, g):
    normed, inv_std, scale = saved
    g32 = g.astype(normed.dtype)
    gs = g32 * scale
    dx = inv_std * (
        gs - gs.mean(-1, keepdims=True) - normed * (gs * normed).mean(-1, keepdims=True)
    )
    if typed(g) is None:
        dscale = (g32 * normed).reshape(-1, normed.shape[-1]).sum(0)
    else:  # Explicit mode has no reshape of [B, T@seq, C] to rows (a pipeline's microbatch)
        dscale = (g32 * normed).sum(tuple(range(normed.ndim - 1)))
    # the scale's gradient in float32 (as formed) where the scale is a bfloat16 copy: rounded
    # to it first, XLA may reduce it over devices in bfloat16 (the precision policy's reduce)
    return dx.astype(g.dtype), dscale.astype(jnp.promote_types(scale.dtype, dscale.dtype))


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


class LayerNorm(nnx.Module):
    """nnx.LayerNorm(use_bias=False)'s parameter (`scale`, ones) and output, with the backward
    above. Same state, so checkpoints written with nnx.LayerNorm restore into it."""

    def __init__(self, num_features: int, *, rngs: nnx.Rngs, epsilon: float = 1e-5, dtype=None):
        rngs.params()  # the key nnx.LayerNorm draws for its scale: later layers' draws stay put
        self.scale = nnx.Param(jnp.ones((num_features,), jnp.float32))
        self.epsilon, self.dtype = epsilon, dtype

    def __call__(self, x):
        x = x if self.dtype is None else x.astype(self.dtype)
        # Inside shard_map, the scale first varies as x does, as it would in JAX's own multiply
        # (a custom backward must return each gradient with its input's type): the cast then
        # transposes into a sum of the scale's gradient over devices, as autodiff's would.
        return layer_norm(x, vary_like(self.scale[...], x), self.epsilon)
