"""1F1B and interleaved 1F1B by hand (`--strategy=pp --pp_schedule=1f1b|interleaved`): every
send a ppermute, every backward a `jax.vjp` of one microbatch through one chunk of layers.

GPipe (pp.py) runs every microbatch forward, then lets `grad` run the ticks in reverse, so each
stage keeps the activations of all M + S - 1 ticks. 1F1B starts each microbatch's backward as
soon as the last stage has its loss: after a warm-up of S - 1 ticks, every tick runs one
forward and one backward on each stage (the table: shard_parity/pipeline.py, `one_f_one_b`),
so a stage keeps the inputs of at most 2S - 1 microbatches, however many there are, and runs
each backward again from its input (`jax.vjp`). The loss and the head run on the last stage
alone, the embedding on stage 0 alone (`lax.cond`): what the other stages get back is the
loss's metrics, a scalar each, and the gradients of the embeddings and the head, summed over
'stage' once after the ticks. Interleaved (`--pp_virtual=V`): each stage runs V chunks of
L/(SV) layers, chunk v of stage s being virtual stage vS + s, and a microbatch goes round the
stages V times; the bubble shrinks from (S - 1)/(M + S - 1) to (S - 1)/(VM + S - 1). The
blocks are placed L/S consecutive layers per stage, as for every schedule and checkpoint, so
the interleaved step moves each chunk to the stage that runs it (`interleave`, V ppermutes of
the stage's weights) and `jax.vjp`'s transpose brings the gradients back. On a named mesh with
a stage axis (`--mesh=fsdp:2,model:2,stage:2 --pp_schedule=1f1b`) the same ticks run with every
other axis inside a stage: the blocks take composed.py's hooks (fsdp's per-layer gather, done in
each unit, tp's psum, cp's ring, the experts' all_to_alls), the rest is gathered and scattered
and the gradients reduced as composed.py does; with experts each unit's statistics get their
share of the loss's gradient in its backward (shard_parity/pipeline.py, `moe_slopes`). Compare
auto/pp_1f1b.py and typed/pp_1f1b.py (the same table and tick, the stages vmapped; typed
refuses a named mesh with 'model' and no 'seq': its `runs`).
"""

import jax
import jax.numpy as jnp

from jax.sharding import PartitionSpec as P

from shard_parity.mesh import FSDP, STAGE
from shard_parity.pipeline import joined, pieces, rest_of, split
from shard_parity.pipeline_1f1b import add, moe_metrics, phases, start, tick
from shard_parity.pipeline import everywhere
from shard_parity.schedules import one_f_one_b
from shard_parity.schedules import interleave_pairs, sends
from shard_parity.placement import (
    REPLICATED,
    STACKED,
    activations,
    in_layout,
    outside_layers,
    state_specs,
)
from shard_parity.step import as_dtype, make_train_step

from . import composed, pp
from .fsdp import gather_outside
from .fsdp import scatter

STRATEGY = 'pp'  # --strategy=pp --pp_schedule=1f1b|interleaved
PLANS = ('pp', 'composed')  # and on a named mesh with a stage axis (the bisector's sides)


def pass_on(y, mesh, plan):  # f32[B/dM, T, C]: stage i's output to i + 1 (interleaved: S-1 to 0)
    return jax.lax.ppermute(y, STAGE, sends(mesh.shape[STAGE], plan.chunks))


def pass_back(dx, mesh, plan):  # the gradient of stage i's input, back to stage i - 1
    return jax.lax.ppermute(dx, STAGE, [(j, i) for i, j in sends(mesh.shape[STAGE], plan.chunks)])


def interleave(blocks, mesh, virtual):  # my L/S layers [Vk, ...] -> the chunks I run [V, k, ...]
    chunks = jax.tree.map(lambda w: w.reshape(virtual, -1, *w.shape[1:]), blocks)
    if virtual == 1:  # each stage runs its own layers (a ppermute to itself would copy them)
        return chunks
    return jax.tree.map(  # my chunk v: a collective-permute per chunk j a stage sends me as v
        lambda w: jnp.stack([
            sum(jax.lax.ppermute(w[j], STAGE, to)
                for (j, u), to in interleave_pairs(mesh.shape[STAGE], virtual).items() if u == v)
            for v in range(virtual)
        ]),
        chunks,
    )  # fmt: skip


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    stages = mesh.shape[STAGE]
    microbatches, virtual = plan.microbatches, plan.chunks  # M; V chunks per stage
    reduce = plan.precision.reduce  # what the gradients' collectives carry (--reduce_dtype)
    table = one_f_one_b(stages, microbatches, virtual)

    def body(params, batch, specs):  # params: my stage's layers, the rest whole; x[B/d, T]
        # On a named mesh (composed.py) each axis inside a stage adds its piece to the blocks:
        # fsdp's per-layer gather (each unit's forward, and its backward's rerun, gathers the
        # layer; the vjp reduce-scatters its gradient), tp's psum, the ring, the experts'.
        call = composed.hooks(plan, specs, mesh, batch)
        call.pop('pipeline', None)  # the ticks below are the pipeline
        # Varying over the batch axes (dp's terms), and the rest over 'stage' too: stage 0's
        # embedding and the last stage's head each give their own term, summed after the ticks
        params = jax.tree.map(  # as composed.py's cast
            lambda w, s: jax.lax.pcast(w, composed.averaged_over(plan, s), to='varying'),
            params,
            specs,
        )
        params = gather_outside(params, specs, mesh, plan) if plan.uses(FSDP) else params
        rest = everywhere(rest_of(params))
        chunks, back = jax.vjp(lambda b: interleave(b, mesh, virtual), params[STACKED])
        model, s = pieces(graphdef, loss_fn, params, call), jax.lax.axis_index(STAGE)  # mine
        batches = jax.tree.map(lambda a: split(a, microbatches), batch)  # [M, B/dM, ...]

        def step(state, row, fwd, bwd, loss):  # every stage's tick, then the hand-overs
            run = tick(model, rest, batches, stages, virtual, fwd, bwd, loss)
            state, y, dx = run(s, chunks, state, jax.tree.map(lambda a: a[s], row))
            if fwd:
                state = state._replace(h=pass_on(y, mesh, plan))  # a collective-permute
            if bwd:
                state = state._replace(g=pass_back(dx, mesh, plan))  # a collective-permute
            return state

        begin = start(model, rest, chunks, batches, table.slots)  # zeros
        state = phases(table, begin, step)
        # the last stage's metrics, and with experts each statistic's mean over the M
        # microbatches and L layers (an all-reduce of scalars) and the metrics' terms in them
        metrics = jax.tree.map(lambda m: m / microbatches, state.metrics)
        if state.stats:
            means = {  # an all-reduce of scalars
                k: jax.lax.psum(v, STAGE) / (microbatches * model.layers)
                for k, v in state.stats.items()
            }
            first = jax.tree.map(lambda a: a[0], batches)
            metrics = add(metrics, jax.tree.map(  # the terms, the same on every stage: stage 0's
                lambda t: jnp.where(s == 0, t, 0), moe_metrics(model, rest, state.h, first, means)
            ))  # fmt: skip
        # the embedding's gradient from stage 0, the head's from the last, and the metrics: an
        # all-reduce over 'stage', in the dtype the gradients' collectives carry (--reduce_dtype)
        d_rest, metrics = jax.lax.psum((as_dtype(state.rest, reduce), metrics), STAGE)
        grads = joined(params, back(state.grads)[0], d_rest)
        grads = (  # the reduce-scatters of the weights outside the layers
            outside_layers(scatter, grads, specs, mesh=mesh, plan=plan)
            if plan.uses(FSDP) else grads
        )  # fmt: skip
        # the all-reduce over 'data' (and the other batch axes of a named mesh)
        return jax.lax.pmean(metrics, plan.batch_axes), composed.reduce(grads, specs, specs, plan)

    def fn(params, batch):  # shard_map's body on each device (the specs from the global shapes)
        specs = state_specs(params, plan, mesh)  # P('stage') for the blocks' layer dimension
        return jax.shard_map(
            lambda params, batch: body(params, batch, specs),
            mesh=mesh,
            in_specs=(specs, P(*activations(plan))),
            out_specs=(REPLICATED, specs),
        )(params, in_layout(batch, plan))  # under 'seq' the positions in the layout's order

    return jax.jit(fn)


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each stage updates its own layers
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    # A forward alone has no backward to interleave: every schedule evaluates as GPipe does
    gpipe = composed if plan.strategy == 'composed' else pp
    return gpipe.eval_step(graphdef, eval_fn, mesh, plan)
