"""Data parallelism written by hand: every collective is a line of this file.

`jax.shard_map` runs the function once per device on that device's shard: the batch arrives as
B/n rows (`P('data')`), the params whole (`P()`). Each device computes the loss and gradient of
its own rows, and one `jax.lax.pmean` over 'data' averages them: the all-reduce that the
compiler inserts by itself in `auto/dp.py`.
"""

import jax

from shard_parity.mesh import DATA
from shard_parity.placement import BATCH, REPLICATED
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'dp'  # --strategy=dp: every array whole on every device


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def local(params, batch):  # params: the full arrays; batch: x[B/n, ...], this device's rows
        # Mark the params as varying per device first. Left invariant, `grad` would transpose their
        # implicit broadcast into a psum, and the pmean below would return the sum, n times too big.
        params = jax.lax.pcast(params, DATA, to='varying')
        # the loss and gradient of the local rows, summed over K microbatches of them (local)
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return jax.lax.pmean((metrics, grads), DATA)  # the all-reduce: average over the 'data' axis

    # the step: `local` on each device's shard (the specs are fixed: nothing to build first)
    fn = jax.shard_map(local, mesh=mesh, in_specs=(REPLICATED, BATCH), out_specs=REPLICATED)
    return jax.jit(fn)


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: the same on every device (replicated)
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # per-example outputs of my rows, concatenated: no collective
        return jax.shard_map(fn, mesh=mesh, in_specs=(REPLICATED, BATCH), out_specs=BATCH)(
            params, batch
        )

    return jax.jit(evaluate)
