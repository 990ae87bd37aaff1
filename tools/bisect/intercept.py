"""How the bisector sees inside a forward pass (tools/bisect/stepping.py): every module's
per-example output, recorded or perturbed by intercepting its __call__.

Only per-example outputs (leading dimension the batch) that are whole on every device are
kept: under explicit tensor parallelism a column-parallel layer's output is one device's columns
and a row-parallel one's a partial sum, which have no counterpart on the other side; under
context parallelism ('seq') an output holds one device's positions only, and is left out the
same way. flax's nnx.capture(method_outputs=) records outputs too, but sorted by name; here the
order they were computed in names the first layer that differs.

`recorded` returns the outputs (and each mixture of experts' router margins, `margins`) for a
side's eval_step; `sensitivities` measures how far each loss metric moves per unit of every
output's rounding (the error model's loss budget, shard_parity/numerics.py's Budget.loss).
"""

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from shard_parity.mesh import MODEL, SEQ
from shard_parity.model import ops
from shard_parity.model.ops import varying
from shard_parity.step import bind

@contextlib.contextmanager
def layers_named(root, paths: dict):
    """The transformer's blocks are stacked: its blocks are built from slices when they run
    (Transformer.layers). While this is open, the modules of each block built are named
    blocks.i.* in `paths`, as when the blocks were a list."""
    layers = getattr(type(root), 'layers', None)
    if layers is None:  # the MLP
        yield
        return

    def named_layers(self):
        blocks = layers(self)
        for i, block in enumerate(blocks):
            paths.update(
                {id(m): '.'.join(map(str, ('blocks', i, *p))) for p, m in nnx.iter_modules(block)}
            )
        return blocks

    type(root).layers = named_layers
    try:
        yield
    finally:
        type(root).layers = layers


ROUTER = '#router'  # a mixture of experts' routing margins, recorded beside its output


@contextlib.contextmanager
def intercepted(model, rows: int, on_output):
    """While open, every per-example output of `model`'s modules (`rows` rows, this device's
    batch; not split over 'model' or 'seq') goes through on_output(path, module, x, input), in
    the order they finish, and what it returns replaces x (a tuple's first element)."""
    root = model.func if isinstance(model, functools.partial) else model
    paths = {id(m): '.'.join(map(str, p)) or 'model' for p, m in nnx.iter_modules(root)}
    originals = {}

    def wrap(cls):
        original = originals[cls] = cls.__call__

        def call(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            x = out[0] if isinstance(out, tuple) else out
            per_example = args and getattr(args[0], 'ndim', 0) >= 2 and args[0].shape[0] == rows
            if id(self) in paths and per_example and not {MODEL, SEQ} & set(varying(x)):
                x = on_output(paths[id(self)], self, x, args[0])
                return (x, *out[1:]) if isinstance(out, tuple) else x
            return out

        cls.__call__ = call

    for cls in {type(m) for _, m in nnx.iter_modules(root)}:
        wrap(cls)
    try:
        with layers_named(root, paths):
            yield
    finally:
        for cls, original in originals.items():
            cls.__call__ = original


def recorded(loss_fn, names: list, kinds: dict | None = None):
    """An eval_fn(model, batch) for eval_step: runs `loss_fn` and returns the per-example outputs
    of every module, in the order they finished; their paths go into `names` while tracing.
    After them, each mixture of experts' routing margins, named path + ROUTER (`margins`)."""

    def capture(model, batch):
        outputs, classes, routers = [], {}, []

        def record(path, module, x, first):
            outputs.append((path, x))
            classes[path] = type(module).__name__
            if type(module).__name__ == 'MoE' and ops.typed(first) is None:
                routers.append((path + ROUTER, margins(module, first)))
            return x

        with intercepted(model, next(iter(batch.values())).shape[0], record):
            loss_fn(model, batch)
        names[:] = [n for n, _ in outputs + routers]
        if kinds is not None:  # each output's module class: a 'MoE' may flip tokens
            kinds.update(classes)
        return tuple(x for _, x in outputs + routers)

    return capture


def sensitivities(graphdef, loss_fn):
    """fn(params, batch) -> {metric: s}, on one device: how far a loss metric m moves when every
    module's output carries independent relative rounding, per unit of it,

        s = sqrt(sum over outputs k of ||dm / d eps_k||^2),   output_k x (1 + eps_k), eps_k = 0,

    the first-order propagation of each output's rounding to the metric, measured on this
    batch and these weights (numerics.Budget.loss takes s / |m|: a mean of T terms averages it
    as sqrt(T), a cross-entropy damps it by the logits' size against the loss, and both are in
    s). One forward and one backward per metric."""

    def metrics(eps, params, batch):
        model, it = nnx.merge(graphdef, params), iter(eps)

        def scale(path, module, x, first):
            return x * (1 + next(it)).astype(x.dtype)  # a bf16 output stays bf16

        with intercepted(model, next(iter(batch.values())).shape[0], scale):
            return loss_fn(model, batch)[1]

    @jax.jit
    def fn(params, batch):
        names = []
        shapes = jax.eval_shape(bind(graphdef, recorded(loss_fn, names)), params, batch)
        eps = [jnp.zeros(x.shape, jnp.float32) for n, x in zip(names, shapes)
               if not n.endswith(ROUTER)]  # fmt: skip
        values, pull = jax.vjp(lambda e: metrics(e, params, batch), eps)
        out = {}
        for k in values:  # one backward per metric, the others' cotangents zero
            cotangent = {j: jnp.asarray(j == k, v.dtype) for j, v in values.items()}
            grads = pull(cotangent)[0]
            out[k] = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in grads))
        return out

    return lambda params, batch: {k: float(v) for k, v in fn(params, batch).items()}


def margins(moe, x):
    """f32[B, T, 2]: each token's router margin at its top-k boundary (the k-th logit less
    the next), and the scale of what a relative rounding of its input moves that margin by
    (||logits|| sqrt(2 / E): two logits' share of the norm); route's logits, in float32 as route
    computes them. A token whose margin is within rounding may flip."""
    k = moe.cfg.experts_per_token
    logits = jnp.einsum('btd,de->bte', x.astype(jnp.float32), moe.router[...].astype(jnp.float32))
    if k >= logits.shape[-1]:  # every expert taken: nothing can flip
        return jnp.stack([jnp.full(logits.shape[:2], jnp.inf), jnp.zeros(logits.shape[:2])], -1)
    top = jax.lax.top_k(logits, k + 1)[0]  # the margin's noise: 2 logits', each ||l|| / sqrt(E)
    noise = jnp.linalg.norm(logits, axis=-1) * math.sqrt(2 / logits.shape[-1])
    return jnp.stack([top[..., k - 1] - top[..., k], noise], -1)
