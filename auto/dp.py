"""Data parallelism the compiler writes: we only say where the arrays live.

The batch is split over the mesh's 'data' axis (`P('data')`, shard_parity/placement.py) and the
params are replicated (`P()`). `jax.jit` sees that every device can only compute a partial
gradient from its rows, and inserts the all-reduce that sums them. There is no collective in
this file; compare it line by line with `explicit/dp.py`, where the same all-reduce is written.
"""

import jax
from jax.sharding import NamedSharding

from shard_parity.placement import BATCH, REPLICATED
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'dp'  # --strategy=dp: every array whole on every device


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def fn(params, batch):  # params @ P(); batch: x[B, ...] @ P('data')
        # over K microbatches of each device's rows: where XLA adds them up is its choice
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        # metrics and grads @ P(): each device's rows give only a partial sum, so the compiler
        # inserts an all-reduce over 'data' here (see parity_tests/test_collectives.py).
        return jax.lax.with_sharding_constraint((metrics, grads), NamedSharding(mesh, REPLICATED))

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is the in_shardings


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: the same on every device (replicated)
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # per-example outputs stay split like the batch: no collective
        return jax.lax.with_sharding_constraint(fn(params, batch), NamedSharding(mesh, BATCH))

    return jax.jit(evaluate)
