"""FSDP and tensor parallelism together, by placement only, on a FSDP x MODEL mesh.

Each weight carries both splits (shard_parity/placement.py): tensor parallelism's over 'model'
and FSDP's over 'fsdp' on a dimension tp leaves free, e.g. a column-parallel kernel
@ P('fsdp', 'model'). XLA all-gathers over 'fsdp' before use, all-reduces activations over
'model', and reduces gradients over 'fsdp' to their shards (on XLA:CPU an all-reduce and a
slice, not a reduce-scatter). As in auto/fsdp.py, the transformer's stacked blocks are gathered
over 'fsdp' one layer at a time inside the scan (`gather_layer`, here to tp's layout), again in
the backward, and each layer's gradient reduced to its shards there. Compare explicit/fsdp_tp.py.
"""

import jax
from jax.sharding import NamedSharding

from shard_parity.placement import FSDP_BATCH, REPLICATED, layer_specs, state_shardings, state_specs
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

from .fsdp import gather_layer, gather_outside

STRATEGY = 'fsdp_tp'  # --strategy=fsdp_tp: tp's split over 'model', fsdp's over 'fsdp'


def loss_and_grads(graphdef, loss_fn, mesh, plan):

    def fn(params, batch):  # params @ P('fsdp', 'model') etc.; batch: x[B, ...] @ P('fsdp')
        specs = state_specs(params, plan, mesh)
        call = gather_layer(layer_specs(specs), mesh, plan)  # over 'fsdp' per layer, if stacked
        grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, **call), has_aux=True)
        params = gather_outside(params, specs, mesh, plan)  # the all-gathers outside
        # XLA all-gathers over 'fsdp', psums 'model'
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        # grads sharded like the params: XLA reduces each gradient over 'fsdp' to its shard.
        grads = jax.lax.with_sharding_constraint(grads, state_shardings(grads, mesh, plan))
        return jax.lax.with_sharding_constraint(metrics, NamedSharding(mesh, REPLICATED)), grads

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is the in_shardings


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates its own shards
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # XLA all-gathers the weights; per-example outputs stay split
        return jax.lax.with_sharding_constraint(fn(params, batch), NamedSharding(mesh, FSDP_BATCH))

    return jax.jit(evaluate)
