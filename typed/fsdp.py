"""FSDP in JAX's Explicit mode: parameters and optimizer state split over 'data' too.

The same step as typed/dp.py, with the weights at rest split on their first dimension
(`f32[784@data, 512]`, shard_parity/placement.py). Two reshards are the two collectives: the
weights to dp's layout, `reduced` over 'data' (an all-gather; a type JAX's all_gather_reduced
gives, so their gradients come out `unreduced`), and those gradients back to the split layout
(a reduce-scatter in the types: unreduced -> split). What XLA:CPU compiles that to is in
docs/typed.md (python -m parity_tests.collectives --strategy=fsdp). Compare explicit/fsdp.py.
"""

import jax
from jax.sharding import NamedSharding

from shard_parity.placement import BATCH, reduced_shardings, state_shardings
from shard_parity.step import bind, make_train_step

STRATEGY = 'fsdp'  # --strategy=fsdp: each array split on its first dimension over 'data'


def loss_and_grads(graphdef, loss_fn, mesh):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def fn(params, batch):  # params: f32[784@data, 512] (1/n of each); batch: x f32[B@data, 784]
        params = jax.reshard(params, reduced_shardings(params, mesh, 'dp'))  # the all-gather
        (_, metrics), grads = grad_fn(params, batch)  # grads: f32[784, 512]{U:data}
        # unreduced -> split over 'data': the reduce-scatter, each device keeps its shard's sum
        return metrics, jax.reshard(grads, state_shardings(grads, mesh, STRATEGY))

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is their type


def train_step(graphdef, loss_fn, tx, mesh):
    # the gradients, then the shared update: each device updates its own shards
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh)
    return make_train_step(grads_fn, tx, mesh, STRATEGY, place=jax.reshard)  # moves: reshard


def eval_step(graphdef, eval_fn, mesh):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # gather the weights; per-example outputs stay split
        params = jax.reshard(params, state_shardings(params, mesh, 'dp'))
        return jax.reshard(fn(params, batch), NamedSharding(mesh, BATCH))

    return jax.jit(evaluate)
