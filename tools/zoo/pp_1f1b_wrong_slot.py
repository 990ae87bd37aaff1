"""explicit/pp_1f1b.py with each backward run on the next slot of the saved inputs: another
microbatch's (or chunk's) input, so `jax.vjp` differentiates the stage at the wrong point. The
forward is untouched, so the loss is right and only the gradients are wrong (the bug zoo)."""

import jax

from shard_parity.explicit import pp_1f1b
from shard_parity.explicit.pp_1f1b import interleave, pass_back, pass_on
from shard_parity.mesh import DATA, STAGE
from shard_parity.pipeline import joined, phases, pieces, rest_of, split, start, tick
from shard_parity.schedules import one_f_one_b
from shard_parity.placement import BATCH, REPLICATED, STACKED, state_specs
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

    def local(params, batch):  # params: my stage's layers, the rest whole; batch: x[B/d, T]
        # Varying over 'data' (dp's terms), and the rest over 'stage' too: stage 0's embedding
        # and the last stage's head each give their own term, added once after the ticks.
        params = jax.lax.pcast(params, DATA, to='varying')
        rest = jax.lax.pcast(rest_of(params), STAGE, to='varying')
        chunks, back = jax.vjp(lambda b: interleave(b, mesh, virtual), params[STACKED])
        model, s = pieces(graphdef, loss_fn, params), jax.lax.axis_index(STAGE)
        batches = jax.tree.map(lambda a: split(a, microbatches), batch)  # [M, B/dM, ...]

        def step(state, row, fwd, bwd, loss):  # every stage's tick, then the hand-overs
            run = tick(model, rest, batches, stages, virtual, fwd, bwd, loss)
            state, y, dx = run(s, chunks, state, jax.tree.map(lambda a: a[s], row))
            if fwd:
                state = state._replace(h=pass_on(y, mesh, plan))  # collective-permute
            if bwd:
                state = state._replace(g=pass_back(dx, mesh, plan))  # collective-permute
            return state

        begin = start(model, rest, chunks, batches, table.slots)  # zeros
        state = phases(table, begin, step)
        # the embedding's gradient from stage 0, the head's from the last: an all-reduce
        rest, metrics = jax.lax.psum((as_dtype(state.rest, reduce), state.metrics), STAGE)
        grads = as_dtype(joined(params, back(state.grads)[0], rest), reduce)
        metrics = jax.tree.map(lambda m: m / microbatches, metrics)
        return jax.lax.pmean((metrics, grads), DATA)  # the all-reduce over 'data'

    def fn(params, batch):  # P('stage') for the blocks' layer dimension, P() the rest
        specs = state_specs(params, plan, mesh)
        return jax.shard_map(
            local, mesh=mesh, in_specs=(specs, BATCH), out_specs=(REPLICATED, specs)
        )(params, batch)

    return jax.jit(fn)
