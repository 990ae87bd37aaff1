"""FSDP and tensor parallelism together, written by hand, on a FSDP x MODEL mesh.

Each weight is first split for tensor parallelism over 'model' (explicit/tp.py), and that slice
again over 'fsdp' (shard_parity/placement.py): a column-parallel kernel f32[in, out] lives as
f32[in/d, out/m]. Each step all-gathers it over 'fsdp' into this device's tensor-parallel slice
f32[in, out/m] (explicit/fsdp.py's `gather`), runs the tensor-parallel model (explicit/tp.py's
`sum_partials`, its psums over 'model'), and reduce-scatters the gradient over 'fsdp'
(`scatter`). As in explicit/fsdp.py, the transformer's stacked blocks are gathered one layer at
a time where the layer runs (`gather_layer`), again in the backward, and each layer's gradient
reduce-scattered there. Compare auto/fsdp_tp.py.
"""

import jax

from shard_parity.mesh import FSDP
from shard_parity.placement import FSDP_BATCH, REPLICATED, layer_specs, outside_layers, state_specs
from shard_parity.step import accumulate, bind, make_train_step

from .fsdp import gather, gather_layer, gather_outside, scatter
from .tp import sum_partials

STRATEGY = 'fsdp_tp'  # --strategy=fsdp_tp: tp's split over 'model', fsdp's over 'fsdp'


def loss_and_grads(graphdef, loss_fn, mesh, plan):

    def fn(params, batch):  # params: 1/d of each tp slice; batch: x[B/d, ...], this group's rows
        specs = state_specs(params, plan, mesh)  # from the global shapes, outside
        call = gather_layer(layer_specs(specs), mesh, plan)  # over 'fsdp' per layer, if stacked
        model_fn = bind(graphdef, loss_fn, sum_partials=sum_partials, **call)
        grad_fn = jax.value_and_grad(model_fn, has_aux=True)

        def local(shards, batch):
            params = gather_outside(shards, specs, mesh, plan)  # the all-gathers outside
            # with the psums over 'model'
            (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
            grads = outside_layers(scatter, grads, specs, mesh=mesh, plan=plan)  # the rest's
            return jax.lax.pmean(metrics, FSDP), grads  # the metrics' all-reduce

        return jax.shard_map(
            local, mesh=mesh, in_specs=(specs, FSDP_BATCH), out_specs=(REPLICATED, specs)
        )(params, batch)

    return jax.jit(fn)


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates its own shards
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn, sum_partials=sum_partials)

    def evaluate(params, batch):  # the all-gathers and psums; per-example outputs stay split
        specs = state_specs(params, plan, mesh)
        local = lambda shards, batch: fn(  # noqa: E731
            jax.tree.map(lambda w, s: gather(w, s, mesh, plan), shards, specs), batch
        )
        return jax.shard_map(local, mesh=mesh, in_specs=(specs, FSDP_BATCH), out_specs=FSDP_BATCH)(
            params, batch
        )

    return jax.jit(evaluate)
