"""What pipeline parallelism's twins share (<twin>/pp.py, pp_1f1b.py, and the composed step's
'stage' axis): the microbatches, and the engine that runs a schedule tick by tick.

Every schedule cuts each row device's rows into M microbatches, dealt round-robin (row r into
microbatch r mod M), on the global batch (auto/, typed/) as on each 'data' device's rows
(explicit/): both give microbatch m the same rows, and each microbatch stays split over 'data'
with no data moved.

GPipe (pp.py) runs M + S - 1 ticks on S stages: at tick t stage s works on microbatch t - s when
0 <= t - s < M, otherwise on zeros whose result no later tick reads (the bubble), and `grad`
runs the ticks backwards. 1F1B and interleaved (pp_1f1b.py) follow a table
(shard_parity/schedules.py): each tick, each stage runs at most one forward unit and one
backward unit (shard_parity/pipeline_1f1b.py's `tick`: a `jax.vjp` of one microbatch through
one chunk, from its saved input), in three phases (`phases`: warm-up, steady state, cool-down).
The model is cut where a pipeline cuts it (`pieces`: the embedding on the first stage, the
blocks, the head and loss on the last). docs/pipeline.md draws each schedule.
"""

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import MODEL, STAGE
from shard_parity.model import ops
from shard_parity.model.ops import typed, varying
from shard_parity.placement import STACKED, activations


def split(x, microbatches: int):
    """x: [B, ...] -> [M, B/M, ...]: row r in microbatch r mod M. In Explicit mode the rows'
    split stays on B/M (ops.split): JAX's reshape rule spread rows split over expert x data x
    fsdp with an fsdp of 1 onto M, which the microbatches' scan refuses (fuzzer, 2026-12-05)."""
    return ops.split(x, 0, (-1, microbatches)).swapaxes(0, 1)


def join(ys):
    """[M, B/M, ...] -> [B, ...], `split`'s inverse."""
    return ops.merge(ys.swapaxes(0, 1), 0, 2)


def in_mesh(fn, mesh):
    """`fn` run with `mesh` as the abstract mesh context, for typed/ on jax 0.12: its stages
    under `vmap` over 'stage' found no mesh to name 'stage' in inside --attention=fused's
    blockwise scan (`Resource axis: stage ... is not found in mesh: ()`; fuzzer, 2026-12-05),
    and pp_1f1b's zeros_like dropped its operand's sharding."""

    def run(*args):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args)

    return run


def feed(inputs, stages: int):
    """What the first stage takes in at each of GPipe's M + S - 1 ticks: the microbatches
    [M, b, ...], then S - 1 of zeros (bubbles): [M + S - 1, b, ...], the scan's xs. (An index
    into the microbatches at tick t would do too, but under typed/ its transpose trips jax
    0.12: a dynamic_update_slice of a 'data'-split row into an unsplit zero array.)"""
    return jnp.pad(inputs, [(0, stages - 1)] + [(0, 0)] * (inputs.ndim - 1))


def in_first_slot(inputs, mesh, plan):
    """[M, b, ...] @ P(None, 'data') -> [M, S, b, ...] @ P(None, 'stage', 'data') (under the
    composed step its rows' and positions': placement.activations(plan)): for a buffer
    of S slots (auto/, typed/), microbatch m in slot 0, stage 0's, and zeros in the others. Laid
    out once, before the ticks' loop: each tick's microbatch then enters the buffer with no data
    moved, and their gradient, a sum over the slots, leaves stage 0 in one all-reduce after the
    loop. (`h.at[0].set(x)` at every tick made the compiler sum it over 'stage' at every tick.)"""
    stages, sharding = mesh.shape[STAGE], NamedSharding(mesh, P(None, STAGE, *activations(plan)))
    explicit = typed(inputs) is not None  # Explicit mode (typed/): the layout is the type
    xs = jnp.broadcast_to(inputs[:, None], (len(inputs), stages, *inputs.shape[1:]),
                          out_sharding=sharding if explicit else None)  # fmt: skip
    first = (jnp.arange(stages) == 0).reshape(1, stages, *[1] * (xs.ndim - 2))
    xs = jnp.where(first, xs, 0)
    return xs if explicit else jax.lax.with_sharding_constraint(xs, sharding)  # auto/: a hint


def microbatch_means(stats, microbatches: int, stage):
    """A mixture of experts' statistics per tick, {name: [M + S - 1, *stage.shape, k]} (k the
    stage's layers), -> each layer's mean over the M microbatches its stage ran, [*stage.shape,
    k]: stage s holds microbatch t - s at tick t when 0 <= t - s < M; its bubbles' (zeros')
    statistics are left out. `stage`: this device's stage index (explicit/), or every slot's,
    arange(S) (auto/, typed/)."""
    def mean(x):
        ticks = jnp.arange(len(x)).reshape(-1, *[1] * jnp.ndim(stage))
        valid = (ticks >= stage) & (ticks < stage + microbatches)
        return jnp.where(valid[..., None], x, 0).sum(0) / microbatches

    return {name: mean(x) for name, x in stats.items()}


class Pieces(NamedTuple):
    """The model cut where a pipeline cuts it. `rest`: the params outside the stacked blocks."""

    embed: Callable  # (rest, tokens i32[b, T]) -> x f32[b, T, C]: the first stage's
    run: Callable  # (blocks [k, ...], x) -> y: k layers, the stages' work
    head_loss: Callable  # (rest, y, batch[, stats]) -> (loss, metrics): the last stage's
    run_stats: Callable = None  # (blocks, x) -> (y, stats): `run` with the experts' [k] each
    layers: int = 0  # L: the model's stacked layers, on every stage together


def pieces(graphdef, loss_fn, params, hooks=None) -> Pieces:
    """`loss_fn`'s model in three pieces: the embedding, a stack of blocks, and the final norm,
    the head and the loss, which `loss_fn` itself runs on activations the pipeline hands in
    (the model's `pipeline` hook returning them), so every task's loss runs unchanged.
    `hooks`: the composed step's model-call keywords for the axes inside a stage (fsdp's
    `layer_weights`, tp's `sum_partials`, the ring's `attention` and `positions`; explicit/
    composed.py's `hooks` less its `pipeline`): the blocks run with them, the embedding takes
    the positions, and the head and loss get them all, as the model call does."""
    blocks, hooks = params[STACKED], dict(hooks or {})
    positions = hooks.get('positions')
    stack = {k: v for k, v in hooks.items() if k in STACK_HOOKS}

    def model(rest):
        return nnx.merge(graphdef, nnx.State({STACKED: blocks, **rest}))

    def head_loss(rest, y, batch, stats=None):
        hook = lambda x, run, weights: (y, stats or {})  # noqa: E731
        return loss_fn(functools.partial(model(rest), pipeline=hook, **hooks), batch)

    run_stats = lambda weights, x: model(rest_of(params)).run_stack(weights, x, **stack)  # noqa: E731
    run = lambda weights, x: run_stats(weights, x)[0]  # noqa: E731
    embed = lambda rest, tokens: model(rest).embedding(tokens, positions=positions)  # noqa: E731
    return Pieces(embed, run, head_loss, run_stats, model(rest_of(params)).cfg.num_layers)


STACK_HOOKS = ('layer_weights', 'sum_partials', 'attention', 'experts')  # run_stack's keywords


def rest_of(params) -> dict:
    """The params outside the stacked blocks: the embeddings and the final norm."""
    return {k: v for k, v in params.items() if k != STACKED}


def joined(params, blocks, rest):
    """`params`' tree, its blocks' leaves from `blocks` and the others' from `rest`."""
    leaves = jax.tree.leaves(nnx.State({STACKED: blocks, **rest}))
    return jax.tree.unflatten(jax.tree.structure(params), leaves)


def when(pred, fn, *args):
    """`fn(*args)` where `pred` holds and zeros of its type elsewhere: `lax.cond`, so that under
    shard_map only the devices where `pred` holds run `fn` (under vmap both branches run, and a
    select keeps one). Both branches' values vary over every Manual axis, as cond needs. In
    Explicit mode (typed/) a select, as `branch` says why."""
    if explicit(args):
        return jax.tree.map(lambda o: jnp.where(pred, o, 0), fn(*args))
    zeros = lambda *a: jax.tree.map(  # noqa: E731
        lambda o: jnp.zeros(o.shape, o.dtype), jax.eval_shape(fn, *a)
    )
    yes, no = lambda *a: everywhere(fn(*a)), lambda *a: everywhere(zeros(*a))  # noqa: E731
    return jax.lax.cond(pred, yes, no, *args)


def branch(pred, yes, no, *args):
    """`lax.cond(pred, yes, no, *args)`. In Explicit mode (typed/), where the stages run under
    `vmap(spmd_axis_name='stage')`, a cond there becomes a select whose predicate, split over
    'stage' only, jax (0.10 and 0.12) refuses beside values split over 'data' too ("select
    `which` must be scalar or have the same sharding as cases"): there `jnp.where` of both
    branches, which is what vmap makes of a cond anyway."""
    if explicit(args):
        return jax.tree.map(lambda a, b: jnp.where(pred, a, b), yes(*args), no(*args))
    return jax.lax.cond(pred, yes, no, *args)


def explicit(tree) -> bool:
    """Whether any array of `tree` has its sharding in its type (typed/'s Explicit mode)."""
    return any(typed(a) is not None for a in jax.tree.leaves(tree))


def everywhere(tree):
    """Inside shard_map: `tree` cast to varying over every Manual axis but 'model'; elsewhere
    `tree`. What a stage holds between ticks (activations, their gradients, the embedding's
    and head's gradients) differs from device to device over every axis but 'model', whose
    devices hold the same (tp's psum): typed invariant there, the transpose of each block's
    first use of its input is the psum over 'model' that its gradient needs."""
    axes = set(jax.sharding.get_abstract_mesh().manual_axes) - {MODEL}
    return jax.tree.map(lambda a: jax.lax.pcast(a, tuple(sorted(axes - varying(a))), to='varying'),
                        tree)  # fmt: skip
