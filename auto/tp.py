"""Tensor parallelism the compiler writes: we place the weights, XLA finds the all-reduces.

The placement is Megatron's (shard_parity/placement.py): column-parallel kernels
@ P(None, 'model'), row-parallel ones @ P('model', None), the batch @ P('data'). From that alone
XLA's sharding propagation splits the activations between the two: `x @ W_col` comes out split
on its features, so the heads are split too, and `h @ W_row` contracts a split dimension, which
leaves partial sums that it all-reduces over 'model': the psum explicit/tp.py writes. No
activation needs an annotation here (python -m inspector --strategy=tp shows
the all-reduces match). The model is called unchanged. Compare explicit/tp.py.
"""

import jax
from jax.sharding import NamedSharding

from shard_parity.placement import BATCH, REPLICATED, state_shardings
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'tp'  # --strategy=tp: layers split over 'model', the batch over 'data'


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def fn(params, batch):  # params @ P(None, 'model') etc.; batch: x[B, ...] @ P('data')
        # XLA all-reduces activations over 'model'
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        # grads sharded like the params: XLA all-reduces each gradient slice over 'data'.
        grads = jax.lax.with_sharding_constraint(grads, state_shardings(grads, mesh, plan))
        return jax.lax.with_sharding_constraint(metrics, NamedSharding(mesh, REPLICATED)), grads

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is the in_shardings


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates its own slices
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # XLA all-reduces activations; outputs stay split
        return jax.lax.with_sharding_constraint(fn(params, batch), NamedSharding(mesh, BATCH))

    return jax.jit(evaluate)
