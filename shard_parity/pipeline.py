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
backward unit (`tick`: a `jax.vjp` of one microbatch through one chunk, from its saved input),
in three phases (`phases`: warm-up, steady state, cool-down). The model is cut where a pipeline
cuts it (`pieces`: the embedding on the first stage, the blocks, the head and loss on the last).
docs/pipeline.md draws each schedule.
"""

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import MODEL, STAGE
from shard_parity.schedules import Ticks
from shard_parity.model import ops
from shard_parity.model.ops import typed, vary_like, varying
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


class Stage(NamedTuple):
    """One stage's state between the ticks of a 1F1B step."""

    h: jax.Array  # f32[b, T, C]: the activation the previous stage handed over
    g: jax.Array  # f32[b, T, C]: the gradient the next stage handed back
    saved: jax.Array  # f32[K, b, T, C]: the inputs of the units run forward, not yet backward
    grads: Any  # the chunks' gradients, [V, k, ...]
    rest: Any  # the embedding's (stage 0) and the head's (the last stage) gradients
    metrics: dict  # the loss's metrics, summed over the microbatches this stage ended
    # With experts (`experts`: a composed mesh's MoE blocks): each statistic summed over the
    # units this stage ran forward, and the loss's derivative in each layer's (`moe_slopes`)
    stats: dict = {}
    slopes: dict = {}


def start(p: Pieces, rest, chunks, batches, slots: int) -> Stage:
    """A stage's state before the first tick: zeros. The chunks' gradients vary where the
    chunks do (`zeros_like` keeps that): under 'model' a layer norm's weight is the same on
    every device of the axis, and so is its gradient."""
    x = jnp.zeros_like(p.embed(rest, batches['x'][0]))
    first = jax.tree.map(lambda a: a[0], batches)
    stats = everywhere(experts(p, chunks, x))  # varying: `moe_slopes`' grad stays this device's
    _, metrics = jax.eval_shape(p.head_loss, rest, x, first, stats or None)
    zeros = jax.tree.map(jnp.zeros_like, (x, x, rest))
    saved = jnp.broadcast_to(x, (slots, *x.shape))
    metrics = {k: jnp.zeros(m.shape, m.dtype) for k, m in metrics.items()}
    grads = jax.tree.map(jnp.zeros_like, chunks)
    slopes = moe_slopes(p, rest, x, first, stats) if stats else {}
    state = Stage(zeros[0], zeros[1], saved, None, zeros[2], metrics, stats, slopes)
    return everywhere(state)._replace(grads=grads)


def experts(p: Pieces, chunks, x) -> dict:
    """Zeros of each MoE statistic a chunk's layers return ({} for dense blocks, whose chunks
    have no router), f32 scalars: a stage's sums."""
    if not any('router' in jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(chunks)):
        return {}
    _, stats = jax.eval_shape(p.run_stats, pick(chunks, 0), x)
    return {k: jnp.zeros((), s.dtype) for k, s in stats.items()}


def moe_slopes(p: Pieces, rest, y, batch, stats) -> dict:
    """The head's loss's derivative in each statistic's mean, read once at zeros: the loss
    takes each statistic's mean over the L layers and M microbatches, as GPipe's does
    (`microbatch_means`), into a term linear in it (tasks.lm_loss: AUX_WEIGHT x the auxiliary
    loss), so the derivative is a constant, and the step's loss's derivative in one layer's
    statistic on one microbatch is it / (M L): a backward unit hands that to the vjp of its
    chunk as the statistics' cotangent (`tick`)."""
    return jax.grad(lambda st: p.head_loss(rest, y, batch, st)[0])(stats)


def moe_metrics(p: Pieces, rest, y, batch, means) -> dict:
    """The metrics' MoE terms, which the heads (run with zero statistics, their own not yet
    known there) leave out: the jvp of the head's metrics in the statistics, at zeros, along
    the step's means (exact for the terms linear in them: the loss's AUX_WEIGHT x aux, aux and
    the dropped share themselves)."""
    zeros = jax.tree.map(jnp.zeros_like, means)
    metrics = lambda st: p.head_loss(rest, y, batch, st)[1]  # noqa: E731
    return jax.jvp(metrics, (zeros,), (means,))[1]


def tick(p: Pieces, rest, batches, stages: int, virtual: int, fwd=True, bwd=True, loss=True):
    """One stage's work at one tick, `(stage, chunks, state, row) -> (state, y, dx)`, the
    output to hand on and the gradient to hand back (the twin moves them): the forward unit
    (stage 0's first chunk embeds its microbatch; the last stage's last chunk runs the head and
    the loss, whose gradient, scaled by 1/M, its backward then takes), then the backward unit
    (`jax.vjp` of its chunk, run again on the saved input: only the stage inputs are kept).
    Off-schedule units run on what is there with a zero gradient: they add nothing."""
    M = batches['x'].shape[0]

    def run(s, chunks, state, row):
        f, b = row
        first, last = (s == 0), (s == stages - 1)
        y = g_last = dx = None
        if fwd:
            tokens = take(batches['x'], f['mb'])
            embed = lambda h: everywhere(p.embed(rest, tokens))  # noqa: E731
            x = branch(first & (f['chunk'] == 0), embed, lambda h: h, state.h)
            if state.stats:  # experts: the unit's statistics, summed where it is on schedule
                y, stats = p.run_stats(pick(chunks, f['chunk']), x)
                on = f['on'].astype(bool)
                state = state._replace(stats={
                    k: v + jnp.where(on, stats[k].sum(), 0) for k, v in state.stats.items()
                })  # fmt: skip
            else:
                y = p.run(pick(chunks, f['chunk']), x)
            state = state._replace(saved=state.saved.at[f['slot']].set(x))
            if loss:
                ends = f['on'].astype(bool) & last & (f['chunk'] == virtual - 1)
                batch = jax.tree.map(lambda a: take(a, f['mb']), batches)
                zeros = jax.tree.map(jnp.zeros_like, state.stats) or None  # added after the ticks
                d_rest, g_last, metrics = when(ends, head_grads, rest, y, batch, zeros)
                state = state._replace(
                    rest=add(state.rest, d_rest), metrics=add(state.metrics, metrics)
                )
        if bwd:
            g = state.g  # the next stage's, or the loss's where this unit ends the model:
            if g_last is not None:
                g = jnp.where(last & (b['chunk'] == virtual - 1), g_last, g)
            g = jnp.where(b['on'].astype(bool), g, 0)
            x = state.saved[b['slot']]
            if state.stats:  # the loss's derivative in each of the chunk's layers' statistics
                (_, stats), back = jax.vjp(p.run_stats, pick(chunks, b['chunk']), x)
                layers = stages * virtual * len(jax.tree.leaves(stats)[0])  # L
                on = b['on'].astype(bool)
                slope = {k: vary_like(jnp.broadcast_to(
                    jnp.where(on, state.slopes[k] / (M * layers), 0), v.shape).astype(v.dtype), v)
                    for k, v in stats.items()}  # fmt: skip
                dw, dx = back((g, slope))
            else:
                _, back = jax.vjp(p.run, pick(chunks, b['chunk']), x)
                dw, dx = back(g)
            begins = b['on'].astype(bool) & first & (b['chunk'] == 0)
            d_rest = when(begins, embed_grads, rest, take(batches['x'], b['mb']), dx)
            state = state._replace(
                grads=jax.tree.map(lambda a, d: a.at[b['chunk']].add(d), state.grads, dw),
                rest=add(state.rest, d_rest),
            )
        return state, y, dx

    def head_grads(rest, y, batch, stats=None):
        head = lambda r, y: p.head_loss(r, y, batch, stats)  # noqa: E731
        loss, back, metrics = jax.vjp(head, rest, y, has_aux=True)
        d_rest, dy = back(jnp.ones_like(loss) / M)  # the step's loss: the microbatches' mean
        return d_rest, dy, metrics

    def embed_grads(rest, tokens, dx):
        return jax.vjp(lambda r: p.embed(r, tokens), rest)[1](dx)[0]

    return run


def take(a, i):
    """a[i], microbatch i of a [M, ...] batch. In Explicit mode (typed/), under the stages'
    `vmap`, an index varying over 'stage' makes a gather whose layout jax cannot infer (jax
    0.10 and 0.12 ask for an out_sharding, and then ignore it on this path): there the row is
    picked by a masked sum over M, elementwise work on small integer arrays."""
    if typed(a) is None:
        return a[i]
    mask = (jnp.arange(a.shape[0]) == i).reshape(-1, *[1] * (a.ndim - 1))
    return jnp.where(mask, a, 0).sum(0)


def pick(tree, i):
    return jax.tree.map(lambda a: a[i], tree)


def add(a, b):
    return jax.tree.map(jnp.add, a, b)


def phases(table: Ticks, state, step):
    """The three phases of a 1F1B schedule, each a `lax.scan` over its ticks:
    `step(state, row, fwd, bwd, loss)` runs every stage's tick and the hand-overs. Rows:
    the table's, {'on', 'mb', 'chunk', 'slot'} of [S] each, for the forward and the backward."""
    rows = jax.tree.map(jnp.asarray, (table.forward, table.backward))
    start_tick = 0
    for n, fwd, bwd in zip(table.phases, (True, True, False), (False, True, True)):
        part = jax.tree.map(lambda a: a[start_tick : start_tick + n], rows)
        start_tick += n
        if n:
            body = lambda c, r: (step(c, r, fwd, bwd, fwd and bwd), None)  # noqa: E731
            state = jax.lax.scan(body, state, part)[0]
    return state
