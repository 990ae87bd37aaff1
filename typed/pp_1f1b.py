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
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import FSDP, STAGE
from shard_parity.pipeline import joined, pieces, rest_of, split
from shard_parity.pipeline_1f1b import add, moe_metrics, phases, start, tick
from shard_parity.pipeline import in_mesh
from shard_parity.schedules import one_f_one_b
from shard_parity.schedules import sends
from shard_parity.placement import STACKED, activations, named, state_shardings, state_specs
from shard_parity.placement import in_layout, outside_layers, without
from shard_parity.step import as_dtype, make_train_step

from . import composed, pp
from .fsdp import gather

STRATEGY = 'pp'  # --strategy=pp --pp_schedule=1f1b|interleaved
PLANS = ('pp', 'composed')  # and on a named mesh with a stage axis (the bisector's sides)


def pass_on(y, mesh, plan):  # f32[S@stage, B/M@data, T, C]: slot i's output to slot i + 1
    return jax.shard_map(  # Manual mode: my slot; interleaved: the last's to slot 0
        lambda y: jax.lax.ppermute(y, STAGE, sends(mesh.shape[STAGE], plan.chunks)),
        mesh=mesh, in_specs=P(STAGE, *activations(plan)), out_specs=P(STAGE, *activations(plan)),
    )(y)  # fmt: skip


def pass_back(dx, mesh, plan):  # the gradient of slot i's input, to slot i - 1
    return jax.shard_map(  # Manual mode: my slot; interleaved: slot 0's to the last
        lambda dx: jax.lax.ppermute(
            dx, STAGE, [(j, i) for i, j in sends(mesh.shape[STAGE], plan.chunks)]
        ),
        mesh=mesh, in_specs=P(STAGE, *activations(plan)), out_specs=P(STAGE, *activations(plan)),
    )(dx)  # fmt: skip


def interleave(blocks, mesh, virtual):  # f32[L@stage, ...] -> the chunks f32[S@stage, V, k, ...]
    # chunk v of stage s: virtual stage vS + s's k layers, which the reshape moves to stage s
    return jax.tree.map(  # [V, S@stage, k, ...] -> [S@stage, V, k, ...], each keeping its
        lambda w: w.reshape(  # other axes' splits
            virtual, mesh.shape[STAGE], -1, *w.shape[1:],
            out_sharding=pp.behind(w, mesh, None, STAGE, None),
        ).swapaxes(0, 1),
        blocks,
    )  # fmt: skip


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    stages = mesh.shape[STAGE]
    microbatches, virtual = plan.microbatches, plan.chunks  # M; V chunks per stage
    reduce = plan.precision.reduce  # what the gradients' collectives carry (--reduce_dtype)
    table = one_f_one_b(stages, microbatches, virtual)

    def body(params, batch, specs):  # params: blocks f32[L@stage, ...], the rest whole
        # On a named mesh (composed.py) each axis inside a stage adds its piece to the blocks:
        # fsdp's per-layer reshard, tp's, the ring, the experts' exchange.
        call = composed.hooks(plan, specs, mesh, batch)
        call.pop('pipeline', None)  # the ticks below are the pipeline
        params = (  # the rest gathered once, whole (vmap refuses a reduced operand), in --dtype
            outside_layers(  # and held in float32 where used
                gather, params, without(specs, FSDP), mesh=mesh, plan=plan,
                held=plan.precision.param,
            ) if plan.uses(FSDP) else params
        )  # fmt: skip
        rest = rest_of(params)
        chunks, back = jax.vjp(lambda b: interleave(b, mesh, virtual), params[STACKED])
        model, s = (  # every slot's stage
            pieces(graphdef, loss_fn, params, call),
            jnp.arange(stages, out_sharding=named(mesh, P(STAGE))),
        )
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
        # the last slot's metrics; each slot's embedding and head gradients (stage 0's, the
        # last's) and the metrics: summed over the slots, 'stage' (an all-reduce)
        metrics = jax.tree.map(lambda m: m / microbatches, state.metrics)
        d_rest, metrics = jax.tree.map(lambda a: a.sum(0), (as_dtype(state.rest, reduce), metrics))
        if state.stats:  # experts: each statistic's mean over the M microbatches and L layers
            # (an all-reduce over 'stage', beside the one above) and the metrics' terms in them
            means = {k: v.sum(0) / (microbatches * model.layers) for k, v in state.stats.items()}
            first = jax.tree.map(lambda a: a[0], batches)
            metrics = add(metrics, moe_metrics(model, rest, state.h.sum(0), first, means))
        grads = joined(params, back(state.grads)[0], d_rest)
        grads = as_dtype(grads, reduce)  # what the all-reduce carries
        return metrics, jax.reshard(grads, state_shardings(grads, mesh, plan))  # all-reduce

    def fn(params, batch):  # the ticks' body, on the arrays as typed (the specs from them)
        specs = state_specs(params, plan, mesh)
        # x i32[B@data, T] (on a named mesh the rows over every row axis; under 'seq' the
        # positions over 'seq' too, in the layout's order first)
        batch = jax.reshard(in_layout(batch, plan), named(mesh, P(*activations(plan))))
        return body(params, batch, specs)

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
