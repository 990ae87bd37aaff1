"""FSDP the compiler writes: parameters and optimizer state split over 'data' too.

The same step as auto/dp.py; only the placement changes: each array's first dimension is split
over the 'data' devices (shard_parity/placement.py), and the gradients are asked for in that
same layout. XLA all-gathers each weight before a layer uses it and reduces each gradient to
the device that holds its shard; each device updates only its own shards. On a GPU that
reduction is a reduce-scatter; XLA:CPU emits an all-reduce of the full gradient and a slice (it
has no reduce-scatter pass: python -m parity_tests.collectives --strategy=fsdp shows it).
Compare explicit/fsdp.py, where both collectives are written out.
"""

import jax
from jax.sharding import NamedSharding

from shard_parity.placement import BATCH, REPLICATED, state_shardings
from shard_parity.step import bind, make_train_step

STRATEGY = 'fsdp'  # --strategy=fsdp: each array split on its first dimension over 'data'


def loss_and_grads(graphdef, loss_fn, mesh):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def fn(params, batch):  # params @ P('data') (1/n of each); batch: x[B, ...] @ P('data')
        (_, metrics), grads = grad_fn(params, batch)  # XLA all-gathers each weight where used
        # grads sharded like the params: XLA reduces each gradient over 'data' to its shard.
        grads = jax.lax.with_sharding_constraint(grads, state_shardings(grads, mesh, STRATEGY))
        return jax.lax.with_sharding_constraint(metrics, NamedSharding(mesh, REPLICATED)), grads

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is the in_shardings


def train_step(graphdef, loss_fn, tx, mesh):
    # the gradients, then the shared update: each device updates its own shards
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh), tx, mesh, STRATEGY)


def eval_step(graphdef, eval_fn, mesh):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # XLA all-gathers the weights; per-example outputs stay split
        return jax.lax.with_sharding_constraint(fn(params, batch), NamedSharding(mesh, BATCH))

    return jax.jit(evaluate)
