"""FSDP and tensor parallelism together in JAX's Explicit mode, on a FSDP x MODEL mesh.

Each weight carries both splits at rest (shard_parity/placement.py), e.g. a column-parallel
kernel `f32[in@fsdp, out@model]`. The step reshards the weights to tp's layout, `reduced` over
'fsdp' (the all-gather over 'fsdp'), runs typed/tp.py's model call (the activations' all-reduces
over 'model' through `sum_partials`), and reshards the `unreduced` gradients back to the split
layout (the reduce-scatter in the types). As in typed/fsdp.py, the transformer's stacked blocks
do both reshards one layer at a time where the layer runs (`gather_layer`), forward and
backward. Compare explicit/fsdp_tp.py.
"""

import jax
from jax.sharding import NamedSharding

from shard_parity.mesh import FSDP
from shard_parity.placement import (
    FSDP_BATCH,
    layer_specs,
    named,
    state_shardings,
    state_specs,
    without,
)
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

from .fsdp import gather_layer, gather_outside
from .tp import sum_partials

STRATEGY = 'fsdp_tp'  # --strategy=fsdp_tp: tp's split over 'model', fsdp's over 'fsdp'


def loss_and_grads(graphdef, loss_fn, mesh, plan):

    def fn(params, batch):  # params: f32[in@fsdp, out@model] etc.; batch: x f32[B@fsdp, ...]
        specs = state_specs(params, plan, mesh)
        call = gather_layer(layer_specs(specs), mesh, plan)  # over 'fsdp' per layer, if stacked
        model_fn = bind(graphdef, loss_fn, sum_partials=sum_partials, **call)
        grad_fn = jax.value_and_grad(model_fn, has_aux=True)
        params = gather_outside(params, specs, mesh, plan)  # the all-gathers outside, in --dtype
        # grads: f32[in, out@model]{U:fsdp}
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        # unreduced -> split over 'fsdp': the reduce-scatter, each device keeps its shard's sum
        grads = as_dtype(grads, plan.precision.reduce)  # what the reduce-scatter carries
        return metrics, jax.reshard(grads, state_shardings(grads, mesh, plan))

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is their type


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates its own shards
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan, place=jax.reshard)  # moves: reshard


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn, sum_partials=sum_partials)

    def evaluate(params, batch):  # gather over 'fsdp'; all-reduce activations; outputs split
        params = jax.reshard(params, named(mesh, without(state_specs(params, plan, mesh), FSDP)))
        return jax.reshard(fn(params, batch), NamedSharding(mesh, FSDP_BATCH))

    return jax.jit(evaluate)
