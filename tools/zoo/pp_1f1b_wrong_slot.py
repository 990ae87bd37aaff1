"""explicit/pp_1f1b.py (on a pp mesh or a named one) with each backward run on the next slot of
the saved inputs: another microbatch's (or chunk's) input, so `jax.vjp` differentiates the stage
at the wrong point. The forward is untouched, so the loss is right and only the gradients are
wrong (the bug zoo)."""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from shard_parity.explicit import composed, pp_1f1b
from shard_parity.explicit.fsdp import gather_outside, scatter
from shard_parity.explicit.pp_1f1b import interleave, pass_back, pass_on
from shard_parity.mesh import FSDP, STAGE
from shard_parity.pipeline import everywhere, joined, pieces, rest_of, split
from shard_parity.pipeline_1f1b import add, moe_metrics, phases, start, tick
from shard_parity.schedules import one_f_one_b
from shard_parity.placement import (
    REPLICATED,
    STACKED,
    activations,
    in_layout,
    outside_layers,
    state_specs,
)
from shard_parity.step import as_dtype

from . import planted

planted(globals(), pp_1f1b)


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    stages = mesh.shape[STAGE]
    microbatches, virtual = plan.microbatches, plan.chunks  # M; V chunks per stage
    reduce = plan.precision.reduce  # what the gradients' collectives carry (--reduce_dtype)
    table = one_f_one_b(stages, microbatches, virtual)
    slot = (table.backward['slot'] + 1) % table.slots  # BUG: the next slot, not the unit's own
    table = table._replace(backward=dict(table.backward, slot=slot))  # BUG: (its own slot's)

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
