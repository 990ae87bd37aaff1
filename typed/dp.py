"""Data parallelism in JAX's Explicit mode: every array's sharding is part of its type.

The mesh's axes are `AxisType.Explicit` (typed/__init__.py), so inside the step `jax.typeof`
says where each array lives: the batch `f32[B@data, 784]`, a weight `f32[784, 512]` (whole on
every device). Nothing is inserted unseen: a product whose output sharding would be ambiguous
says it (`out_sharding=`, shard_parity/model/ops.py), and data moves only at a `reshard`. One
cast places the gradient all-reduce: the weights become `reduced` over 'data' (a type, free:
they are whole everywhere already), so their gradients come out `unreduced`, each device's
partial sum, and one `reshard` adds them. Compare explicit/dp.py, where it is a `pmean`.
"""

import jax
from jax.sharding import NamedSharding

from shard_parity.placement import BATCH, reduced_shardings, state_shardings
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'dp'  # --strategy=dp: every array whole on every device


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def fn(params, batch):  # params: f32[784, 512] (whole); batch: x f32[B@data, 784]
        # Free: reduced weights get unreduced gradients, left for us to add (parity_tests/
        # test_typed.py reads these types while the step is traced).
        params = jax.reshard(params, reduced_shardings(params, mesh, plan))
        # grads: f32[784, 512]{U:data}, the K microbatches' sum still unreduced: one add below
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return metrics, jax.reshard(grads, state_shardings(grads, mesh, plan))  # all-reduce

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is their type


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: the same on every device (replicated)
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan, place=jax.reshard)  # moves: reshard


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # per-example outputs f32[B@data, ...]: no collective
        return jax.reshard(fn(params, batch), NamedSharding(mesh, BATCH))

    return jax.jit(evaluate)
