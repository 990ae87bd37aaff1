"""1F1B and interleaved 1F1B in JAX's Explicit mode (`--strategy=pp --pp_schedule=1f1b|
interleaved`): every stage's state typed over 'stage', every send a Manual ppermute.

The same table as explicit/pp_1f1b.py (shard_parity/pipeline.py, `one_f_one_b`) and the same
tick (`tick`: one forward unit, then one backward unit by `jax.vjp` from the saved input), run
for all S stages at once: `vmap` over the stage dimension, `spmd_axis_name='stage'`, so each
device runs its own stage's slot. The state between ticks is a `Stage` of buffers typed
`[S@stage, ...]`: the handed-over activation and gradient `f32[S@stage, B/M@data, T, C]` and
the saved inputs `f32[S@stage, K, B/M@data, T, C]`. Explicit mode has no type for "pass my
slot to the next device", so `pass_on` and `pass_back` drop to Manual mode, `jax.shard_map`
around one ppermute each, as explicit/pp_1f1b.py's. The embedding, the head and the loss are a
`lax.cond` on the stage in the tick; under `vmap` a cond becomes a select, so every slot
computes them and keeps its own (here spelled `jnp.where`, and the microbatch picked by a
masked sum: jax refuses a batched cond and a stage-varying gather on Explicit axes,
docs/pipeline.md; `pipeline.branch` and `take`). The blocks stay replicated over 'data', as in
typed/pp.py (vmap refuses a reduced operand), so their gradients are reduced at every tick.
Interleaved (`--pp_virtual=V`): the layers are viewed as
`[S@stage, V, L/(SV), ...]`, chunk v of stage s being virtual stage vS + s, a reshape whose
out_sharding moves each chunk to the stage that runs it. On a named mesh with a stage axis the
blocks take composed.py's hooks (fsdp's per-layer reshard, the ring, the experts' exchange)
under the same vmap (beside 'model', the heads' repeat for GQA says its sharding:
shard_parity/model/attention.py). Compare auto/pp_1f1b.py.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import FSDP, SEQ, STAGE
from shard_parity.model.ring import reorder
from shard_parity.pipeline import (
    add,
    in_mesh,
    joined,
    moe_metrics,
    phases,
    pieces,
    rest_of,
    split,
    start,
    tick,
)
from shard_parity.schedules import one_f_one_b, sends
from shard_parity.placement import (
    STACKED,
    activations,
    named,
    outside_layers,
    state_shardings,
    state_specs,
    without,
)
from shard_parity.step import as_dtype, make_train_step

from . import composed, pp

STRATEGY = 'pp'  # --strategy=pp --pp_schedule=1f1b|interleaved
PLANS = ('pp', 'composed')  # and on a named mesh with a stage axis (the bisector's sides)


def pass_on(y, mesh, plan):  # f32[S@stage, B/M@data, T, C]: slot i's output to slot i + 1
    spec = P(STAGE, *activations(plan))  # Manual mode: my slot; interleaved: the last's to 0
    shift = lambda y: jax.lax.ppermute(y, STAGE, sends(plan.size(STAGE), plan.chunks))  # noqa: E731
    return jax.shard_map(shift, mesh=mesh, in_specs=spec, out_specs=spec)(y)


def pass_back(dx, mesh, plan):  # the gradient of slot i's input, to slot i - 1
    spec = P(STAGE, *activations(plan))  # Manual mode: my slot; interleaved: slot 0's to the last
    shift = lambda dx: jax.lax.ppermute(  # noqa: E731
        dx, STAGE, [(j, i) for i, j in sends(mesh.shape[STAGE], plan.chunks)]
    )
    return jax.shard_map(shift, mesh=mesh, in_specs=spec, out_specs=spec)(dx)


def interleave(blocks, mesh, virtual):  # f32[L@stage, ...] -> the chunks f32[S@stage, V, k, ...]
    # chunk v of stage s: virtual stage vS + s's k layers, which the reshape moves to stage s
    n = mesh.shape[STAGE]  # [V, S@stage, k, ...], each keeping its other axes' splits
    split = lambda w: pp.behind(w, mesh, None, STAGE, None)  # noqa: E731
    chunks = jax.tree.map(
        lambda w: w.reshape(virtual, n, -1, *w.shape[1:], out_sharding=split(w)), blocks
    )
    return jax.tree.map(lambda w: w.swapaxes(0, 1), chunks)


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    stages = mesh.shape[STAGE]
    microbatches, virtual = plan.microbatches, plan.chunks  # M; V chunks per stage
    reduce = plan.precision.reduce  # what the gradients' collectives carry (--reduce_dtype)
    table = one_f_one_b(stages, microbatches, virtual)

    def fn(params, batch):  # params: blocks f32[L@stage, ...], the rest whole; x i32[B@data, T]
        specs = state_specs(params, plan, mesh)
        # On a named mesh (composed.py) each axis inside a stage adds its piece to the blocks:
        # fsdp's per-layer reshard, tp's, the ring, the experts' exchange.
        call = composed.hooks(plan, specs, mesh, batch)
        call.pop('pipeline', None)  # the ticks below are the pipeline
        batch = reorder(batch, plan.size(SEQ), plan.layout) if plan.uses(SEQ) else batch
        batch = jax.reshard(batch, NamedSharding(mesh, P(*activations(plan))))
        if plan.uses(FSDP):  # the rest gathered once (the all-gathers carry --dtype)
            params = outside_layers(as_dtype, params, dtype=plan.precision.compute)
            params = outside_layers(jax.reshard, params, named(mesh, without(specs, FSDP)))
            params = outside_layers(as_dtype, params, dtype=plan.precision.param)  # held in f32
        rest = rest_of(params)
        chunks, back = jax.vjp(lambda b: interleave(b, mesh, virtual), params[STACKED])
        s = jnp.arange(stages, out_sharding=named(mesh, P(STAGE)))  # every slot's stage
        model = pieces(graphdef, loss_fn, params, call)
        batches = jax.tree.map(lambda a: split(a, microbatches), batch)  # [M, B/M@data, ...]

        def step(state, row, fwd, bwd, loss):  # every stage's tick, then the hand-overs
            run = tick(model, rest, batches, stages, virtual, fwd, bwd, loss)
            row = jax.reshard(row, named(mesh, P(STAGE)))  # each stage its own: no data moved
            state, y, dx = jax.vmap(run, spmd_axis_name=STAGE)(s, chunks, state, row)
            if fwd:
                state = state._replace(h=pass_on(y, mesh, plan))  # a collective-permute
            if bwd:
                state = state._replace(g=pass_back(dx, mesh, plan))  # a collective-permute
            return state

        begin = jax.vmap(  # zeros; the metrics [S] split over 'stage' too, as vmap wants:
            lambda c: start(model, rest, c, batches, table.slots), spmd_axis_name=STAGE
        )(chunks)
        begin = begin._replace(**{  # with experts their statistics' sums and slopes too
            k: jax.reshard(getattr(begin, k), named(mesh, P(STAGE)))
            for k in ('metrics', 'stats', 'slopes')
        })  # fmt: skip
        state = phases(table, begin, step)
        # each slot's embedding and head gradients (stage 0's, the last's): summed over 'stage'
        d_rest, metrics = jax.tree.map(lambda a: a.sum(0), (state.rest, state.metrics))
        metrics = jax.tree.map(lambda m: m / microbatches, metrics)
        if state.stats:  # experts: each statistic's mean over the M microbatches and L layers,
            # and the metrics' terms in them
            layers = stages * virtual * jax.tree.leaves(chunks)[0].shape[2]
            means = {k: v.sum(0) / (microbatches * layers) for k, v in state.stats.items()}
            first = jax.tree.map(lambda a: a[0], batches)
            metrics = add(metrics, moe_metrics(model, rest, state.h.sum(0), first, means))
        grads = as_dtype(joined(params, back(state.grads)[0], d_rest), reduce)
        return metrics, jax.reshard(grads, state_shardings(grads, mesh, plan))  # all-reduce

    # the mesh as context (pipeline.in_mesh): without it jax 0.12's zeros_like (the stages'
    # zeros before the first tick) drops its operand's sharding, 0.10's keeps it
    return jax.jit(in_mesh(fn, mesh))  # the inputs' placement (place_state, place_batch): types


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each stage updates its own layers
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan, place=jax.reshard)  # moves: reshard


def eval_step(graphdef, eval_fn, mesh, plan):
    # A forward alone has no backward to interleave: every schedule evaluates as GPipe does
    gpipe = composed if plan.strategy == 'composed' else pp
    return gpipe.eval_step(graphdef, eval_fn, mesh, plan)
