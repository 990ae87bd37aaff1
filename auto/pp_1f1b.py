"""1F1B and interleaved 1F1B as the compiler writes them (`--strategy=pp --pp_schedule=1f1b|
interleaved`): every stage's state a buffer sharded over 'stage', every send a shift of it.

The same table as explicit/pp_1f1b.py (shard_parity/pipeline.py, `one_f_one_b`) and the same
tick (`tick`: one forward unit, then one backward unit by `jax.vjp` from the saved input), run
for all S stages at once: `vmap` over the stage dimension, `spmd_axis_name='stage'`, so each
device runs its own stage's slot. The state between ticks is a `Stage` of buffers [S, ...] @
P('stage', ...): the handed-over activation and gradient f32[S, B/M, T, C] @ P('stage',
'data'), and the saved inputs f32[S, K, B/M, T, C]. `pass_on` shifts the activations one slot
down and `pass_back` the gradients one slot up; XLA writes each shift as a collective-permute.
The embedding, the head and the loss are a `lax.cond` on the stage in the tick; under `vmap`
a cond becomes a select, so every slot computes them and keeps its own: the compiler, not
this file, decides where the masked work runs. Interleaved (`--pp_virtual=V`): the layers
are viewed as [S, V, L/(SV), ...], chunk v of stage s being virtual stage vS + s, which XLA
moves to the stage that runs it. On a named mesh with a stage axis the blocks take
composed.py's hooks (fsdp's per-layer constraint, the experts' exchange) under the same vmap.
Compare explicit/pp_1f1b.py.
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import FSDP, STAGE
from shard_parity.pipeline import joined, pieces, rest_of, split
from shard_parity.pipeline_1f1b import add, moe_metrics, phases, start, tick
from shard_parity.schedules import one_f_one_b
from shard_parity.placement import STACKED, activations, named, state_shardings, state_specs
from shard_parity.step import as_dtype, make_train_step

from . import composed, pp
from .fsdp import gather_outside

STRATEGY = 'pp'  # --strategy=pp --pp_schedule=1f1b|interleaved
PLANS = ('pp', 'composed')  # and on a named mesh with a stage axis (the bisector's sides)


def pass_on(y, mesh, plan):  # f32[S, B/M, T, C]: slot i's output to slot i + 1
    # XLA: a collective-permute. The last slot's goes round to slot 0: the input of interleaved's
    # next chunk; under 1f1b stage 0 embeds a new microbatch and never reads it.
    return jax.lax.with_sharding_constraint(
        jnp.roll(y, 1, axis=0), named(mesh, P(STAGE, *activations(plan)))
    )


def pass_back(dx, mesh, plan):  # the gradient of slot i's input, to slot i - 1
    # XLA: a collective-permute. Slot 0's goes round to the last: interleaved's previous chunk;
    # under 1f1b the last stage takes its loss's gradient and never reads it.
    return jax.lax.with_sharding_constraint(
        jnp.roll(dx, -1, axis=0), named(mesh, P(STAGE, *activations(plan)))
    )


def interleave(blocks, mesh, virtual):  # [L, ...] @ P('stage') -> the chunks [S, V, k, ...]
    chunks = jax.tree.map(  # chunk v of stage s: virtual stage vS + s's k layers
        lambda w: w.reshape(virtual, mesh.shape[STAGE], -1, *w.shape[1:]).swapaxes(0, 1), blocks
    )
    if virtual == 1:  # each stage runs its own layers, where they are placed
        return chunks
    return jax.lax.with_sharding_constraint(chunks, named(mesh, P(STAGE)))  # XLA moves them


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    stages = mesh.shape[STAGE]
    microbatches, virtual = plan.microbatches, plan.chunks  # M; V chunks per stage
    reduce = plan.precision.reduce  # what the gradients' collectives carry (--reduce_dtype)
    table = one_f_one_b(stages, microbatches, virtual)

    def body(params, batch, specs):  # blocks [L, ...] @ P('stage'), the rest @ P(); x[B, T]
        # On a named mesh (composed.py) each axis inside a stage adds its piece to the blocks:
        # fsdp's per-layer constraint (each unit's forward, and its backward's rerun, gathers the
        # layer), the experts' exchange; 'model' and 'seq' are placements alone.
        call = composed.hooks(plan, specs, mesh, batch)
        call.pop('pipeline', None)  # the ticks below are the pipeline
        params = gather_outside(params, specs, mesh, plan) if plan.uses(FSDP) else params
        rest = rest_of(params)
        chunks, back = jax.vjp(lambda b: interleave(b, mesh, virtual), params[STACKED])
        model, s = pieces(graphdef, loss_fn, params, call), jnp.arange(stages)  # every slot's
        batches = jax.tree.map(lambda a: split(a, microbatches), batch)  # [M, B/M, ...]

        def step(state, row, fwd, bwd, loss):  # every stage's tick, then the hand-overs
            run = tick(model, rest, batches, stages, virtual, fwd, bwd, loss)
            state, y, dx = jax.vmap(run, spmd_axis_name=STAGE)(s, chunks, state, row)
            if fwd:
                state = state._replace(h=pass_on(y, mesh, plan))  # a collective-permute
            if bwd:
                state = state._replace(g=pass_back(dx, mesh, plan))  # a collective-permute
            return state

        begin = jax.vmap(lambda c: start(model, rest, c, batches, table.slots))(chunks)  # zeros
        state = phases(table, begin, step)
        # the last slot's metrics; each slot's embedding and head gradients (stage 0's, the
        # last's) and the metrics: summed over the slots, 'stage' (XLA: an all-reduce)
        metrics = jax.tree.map(lambda m: m / microbatches, state.metrics)
        d_rest, metrics = jax.tree.map(lambda a: a.sum(0), (as_dtype(state.rest, reduce), metrics))
        if state.stats:  # experts: each statistic's mean over the M microbatches and L layers
            # (XLA's all-reduce over 'stage', beside the one above) and the metrics' terms in them
            means = {k: v.sum(0) / (microbatches * model.layers) for k, v in state.stats.items()}
            first = jax.tree.map(lambda a: a[0], batches)
            metrics = add(metrics, moe_metrics(model, rest, state.h.sum(0), first, means))
        grads = joined(params, back(state.grads)[0], d_rest)
        grads = as_dtype(grads, reduce)  # what the all-reduce carries
        # grads @ the params' layout; the rest (and the metrics) XLA all-reduces over 'data'
        return metrics, jax.lax.with_sharding_constraint(grads, state_shardings(grads, mesh, plan))

    def fn(params, batch):  # the ticks' body, on the arrays as placed (the specs from them)
        specs = state_specs(params, plan, mesh)
        # x[B, T] @ P('data') (on a named mesh the rows over every row axis, under 'seq' the
        # positions over 'seq' too)
        batch = jax.lax.with_sharding_constraint(batch, named(mesh, P(*activations(plan))))
        return body(params, batch, specs)

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is the in_shardings


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each stage updates its own layers
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    # A forward alone has no backward to interleave: every schedule evaluates as GPipe does
    gpipe = composed if plan.strategy == 'composed' else pp
    return gpipe.eval_step(graphdef, eval_fn, mesh, plan)
