"""Tensor parallelism (Megatron) in JAX's Explicit mode, with data parallelism over 'data'.

The weights are placed as in every twin (shard_parity/placement.py): column-parallel kernels
`f32[in, out@model]`, row-parallel ones `f32[in@model, out]`, so the types carry the split
through the layers: `x @ W_col` is `f32[B@data, T, 4C@model]`, and the heads are split with it.
A row-parallel product contracts the split dimension, which Explicit mode will not resolve by
itself: shard_parity/model/ops.py gives it `out_sharding=` with the sum `unreduced` over
'model' (`f32[B@data, T, C]{U:model}`, each device's partial sum), and `sum_partials` below,
passed into the model call as in explicit/tp.py, reshards it: the all-reduce of activations.
Its backward twin, before each column-parallel layer, is the weight's `out_sharding` in the
input-gradient dot (whole over 'model', so summed). The gradients over 'data' as in typed/dp.py.
"""

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity.placement import BATCH, reduced_shardings, state_shardings
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'tp'  # --strategy=tp: layers split over 'model', the batch over 'data'


def sum_partials(y):  # y: f32[B@data, T, C]{U:model}, the partial sums of a row-parallel matmul
    # -> f32[B@data, T, C]: the all-reduce of activations ("g"). y keeps its own split (the rows
    # over 'fsdp' under fsdp_tp, over every row axis in composed.py), less the unreduced 'model'.
    sharding = jax.typeof(y).sharding
    return jax.reshard(y, NamedSharding(sharding.mesh, P(*sharding.spec.partitions)))


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, sum_partials=sum_partials), has_aux=True)

    def fn(params, batch):  # params: f32[in, out@model] etc.; batch: x f32[B@data, ...]
        # As in dp: reduced over 'data' (free), so the gradients come out unreduced over it.
        params = jax.reshard(params, reduced_shardings(params, mesh, plan))
        # grads: f32[in, out@model]{U:data}
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return metrics, jax.reshard(grads, state_shardings(grads, mesh, plan))  # all-reduce

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is their type


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates its own slices
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan, place=jax.reshard)  # moves: reshard


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn, sum_partials=sum_partials)

    def evaluate(params, batch):  # the activations' all-reduces; outputs stay split
        return jax.reshard(fn(params, batch), NamedSharding(mesh, BATCH))

    return jax.jit(evaluate)
