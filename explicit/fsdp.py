"""FSDP written by hand: every device keeps 1/n of each weight and of its optimizer state,
all-gathers one layer's weights where that layer runs, and reduce-scatters its gradient there.

Compare auto/fsdp.py. The transformer's blocks are stacked and run under a scan
(shard_parity/model/transformer.py); `layer_weights` is what the scan calls on each layer's
shards. Forward: all-gather that layer (`gather`), run it, drop the gathered weights (the
checkpoint policy keeps none for the backward). Backward: the scan runs the layers in reverse,
all-gathers each layer again to recompute it, and reduce-scatters its gradient (`scatter`:
psum_scatter / n, the mean of the n devices' gradients, each device keeping its shard's)
before the next layer's. So a device holds 1/n of the state plus about one layer whole.
Embeddings and the final norm (and every weight of the MLP, which has no stacked layers) are
gathered once, at the top (`gather_outside`), and their gradients reduce-scattered at the end.
"""

import jax

from shard_parity.mesh import FSDP
from shard_parity.placement import FSDP_BATCH, REPLICATED, layer_specs, outside_layers, state_specs
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'fsdp'  # --strategy=fsdp: each array split on its first dimension over 'fsdp'


def gather(shard, spec, mesh, plan, held=None):  # a shard f32[d/n, ...] -> the whole weight
    # (`mesh`: each twin's gather and scatter take the same arguments; here the axis's name is
    # enough, as every collective inside shard_map runs over the mesh it was given)
    if FSDP not in spec:  # a small array kept whole (a bias of odd size): cast as in dp
        return jax.lax.pcast(shard, FSDP, to='varying')
    whole = jax.lax.all_gather(  # the all-gather, of the shard cast to --dtype first
        as_dtype(shard, plan.precision.compute), FSDP, axis=spec.index(FSDP), tiled=True
    )
    return whole if held is None else as_dtype(whole, held)  # held in `held` where used


def scatter(grad, spec, mesh, plan):  # the local gradient of a whole weight -> my shard's mean
    if FSDP not in spec:
        return jax.lax.pmean(as_dtype(grad, plan.precision.reduce), FSDP)  # all-reduce
    return (  # the reduce-scatter, of the gradient cast to --reduce_dtype first
        jax.lax.psum_scatter(as_dtype(grad, plan.precision.reduce), FSDP,
                             scatter_dimension=spec.index(FSDP), tiled=True)
        / jax.lax.axis_size(FSDP)  # the reduce-scatter's sum / n: the mean of the n gradients
    )  # fmt: skip


def gather_layer(specs, mesh, plan):
    """`layer_weights` for the model (none without stacked layers): one layer's shards -> its
    whole weights, where the layer runs; their gradient -> the shards' mean, in the backward
    (in the shards' float32)."""

    @jax.custom_vjp
    def layer_weights(shards):  # the layer's all-gathers
        return jax.tree.map(lambda w, s: gather(w, s, mesh, plan), shards, specs)

    def backward(_, grads):  # the layer's reduce-scatters, inside the backward's loop
        scattered = jax.tree.map(lambda g, s: scatter(g, s, mesh, plan), grads, specs)
        return (as_dtype(scattered, plan.precision.param),)

    layer_weights.defvjp(lambda shards: (layer_weights(shards), None), backward)
    return {} if specs is None else {'layer_weights': layer_weights}


def gather_outside(params, specs, mesh, plan):
    """The weights outside the layers (the embeddings, the final norm; all of the MLP), each
    gathered as a layer is, once, and held in float32 where it is used: the policy looks the
    rows up in a float32 table, whose gradient, a scatter-add, adds in float32 (a table used in
    bf16 had its gradient formed in bf16: auto/'s partitioner reduced it there, before any cast)."""
    return outside_layers(gather, params, specs, mesh=mesh, plan=plan, held=plan.precision.param)


def loss_and_grads(graphdef, loss_fn, mesh, plan):

    def fn(params, batch):  # params: 1/n of each array; batch: x[B/n, ...], this device's rows
        specs = state_specs(params, plan, mesh)  # from the global shapes, outside
        call = gather_layer(layer_specs(specs), mesh, plan)  # the per-layer gather, if stacked
        grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, **call), has_aux=True)

        def local(shards, batch):
            params = gather_outside(shards, specs, mesh, plan)  # the all-gathers outside
            # the layers' reduce-scattered already
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
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # all the all-gathers up front; per-example outputs stay split
        specs = state_specs(params, plan, mesh)
        local = lambda shards, batch: fn(  # noqa: E731
            jax.tree.map(lambda w, s: gather(w, s, mesh, plan), shards, specs), batch
        )
        return jax.shard_map(local, mesh=mesh, in_specs=(specs, FSDP_BATCH), out_specs=FSDP_BATCH)(
            params, batch
        )

    return jax.jit(evaluate)
