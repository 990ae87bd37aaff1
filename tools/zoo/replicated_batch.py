"""explicit/dp.py with the batch's in_spec P() (replicated) where P('data') belongs (the bug zoo):
every device takes the whole batch."""

import jax

from shard_parity.explicit import dp
from shard_parity.mesh import DATA
from shard_parity.placement import BATCH, REPLICATED
from shard_parity.step import accumulate, as_dtype, bind

from . import planted

planted(globals(), dp)


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def local(params, batch):  # params: the full arrays; batch: x[B/n, ...], this device's rows
        params = jax.lax.pcast(params, DATA, to='varying')
        # the loss and gradient of the local rows, summed over K microbatches of them (local)
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return jax.lax.pmean((metrics, grads), DATA)  # the all-reduce: average over the 'data' axis

    # the step: `local` on each device's shard (the specs are fixed: nothing to build first)
    fn = jax.shard_map(  # BUG: the batch's in_spec REPLICATED, P(), where explicit/dp.py has BATCH
        local, mesh=mesh, in_specs=(REPLICATED, REPLICATED), out_specs=REPLICATED
    )
    return jax.jit(fn)


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # per-example outputs of my rows, concatenated: no collective
        return jax.shard_map(  # BUG: the batch's in_spec REPLICATED, as above
            fn, mesh=mesh, in_specs=(REPLICATED, REPLICATED), out_specs=BATCH
        )(params, batch)

    return jax.jit(evaluate)
