"""FSDP the compiler writes: parameters and optimizer state split over 'fsdp' too.

The same step as auto/dp.py, with the arrays split over the 'fsdp' devices
(shard_parity/placement.py) and the gradients asked for in that same layout. The transformer's
blocks are stacked and run under a scan (shard_parity/model/transformer.py). `layer_weights`,
which the scan calls on each layer's shards where that layer runs, constrains them to the whole
layout: XLA all-gathers that one layer inside the loop body. Its backward constrains the
layer's gradient to the split layout, in the backward's loop body: a reduce-scatter there (or
an all-reduce and a slice, python -m inspector --strategy=fsdp shows which). The
checkpoint policy keeps no gathered weight for the backward, which gathers each layer again.
Without these constraints XLA may gather the whole stack before the loop and keep it.
Everything outside the blocks (and all of the MLP) is gathered the same way, once, at the top
(`gather_outside`), and `scatter` asks for its gradients in the shards' layout: XLA
reduce-scatters them at the end.
Compare explicit/fsdp.py, where the collectives are written out.
"""

import jax

from shard_parity.mesh import FSDP
from shard_parity.placement import FSDP_BATCH, REPLICATED, layer_specs, outside_layers, state_specs
from shard_parity.placement import named, without
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'fsdp'  # --strategy=fsdp: each array split on its first dimension over 'fsdp'


def gather(shard, spec, mesh, plan, held=None):  # a weight's shard -> the whole weight
    if FSDP not in spec:  # a small array kept whole (a bias of odd size): as in dp
        return shard
    shard = jax.lax.with_sharding_constraint(  # the all-gather XLA inserts for the constraint
        as_dtype(shard, plan.precision.compute), named(mesh, spec)  # of the shard cast first
    )
    whole = jax.lax.with_sharding_constraint(shard, named(mesh, without(spec, FSDP)))
    return whole if held is None else as_dtype(whole, held)  # held in `held` where used


def scatter(grad, spec, mesh, plan):  # the gradient of a whole weight -> its shard's layout
    return jax.lax.with_sharding_constraint(  # XLA's reduce-scatter, in --reduce_dtype
        as_dtype(grad, plan.precision.reduce), named(mesh, spec)
    )


def gather_layer(specs, mesh, plan):
    """`layer_weights` for the model (none without stacked layers): one layer's shards -> its
    whole weights, where the layer runs; their gradient -> the shards' layout, in the backward
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

    def fn(params, batch):  # params @ P('fsdp') (1/n of each); batch: x[B, ...] @ P('fsdp')
        specs = state_specs(params, plan, mesh)
        call = gather_layer(layer_specs(specs), mesh, plan)  # the per-layer gather, if stacked
        grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, **call), has_aux=True)
        params = gather_outside(params, specs, mesh, plan)  # the all-gathers outside
        # the layers' reduce-scattered already
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = outside_layers(scatter, grads, specs, mesh=mesh, plan=plan)  # the rest's
        return jax.lax.with_sharding_constraint(metrics, named(mesh, REPLICATED)), grads

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is the in_shardings


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates its own shards
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # XLA all-gathers the weights; per-example outputs stay split
        return jax.lax.with_sharding_constraint(fn(params, batch), named(mesh, FSDP_BATCH))

    return jax.jit(evaluate)
