"""The engine of the table-driven schedules (<twin>/pp_1f1b.py: 1F1B and interleaved), shared by
the twins: a stage's state between ticks (`Stage`, `start`), one stage's work at one tick
(`tick`: at most one forward unit and one backward unit, each a `jax.vjp` of one microbatch
through one chunk from its saved input) and the three phases that scan the ticks (`phases`:
warm-up, steady state, cool-down), with a mixture of experts' statistics carried through them.
shard_parity/pipeline.py holds the microbatches and the model cut into stages; the twins move
what `tick` hands on and back.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from shard_parity.model.ops import typed, vary_like
from shard_parity.pipeline import Pieces, branch, everywhere, when
from shard_parity.schedules import Ticks


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
