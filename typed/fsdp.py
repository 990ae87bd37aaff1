"""FSDP in JAX's Explicit mode: parameters and optimizer state split over 'fsdp' too.

The same step as typed/dp.py, with the weights at rest split (`f32[784@fsdp, 512]`,
shard_parity/placement.py). Two reshards are the two collectives: the weights to dp's layout,
`reduced` over 'fsdp' (an all-gather; a type JAX's all_gather_reduced gives, so their
gradients come out `unreduced`), and those gradients back to the split layout (a reduce-scatter
in the types: unreduced -> split). The transformer's blocks are stacked and run under a scan
(shard_parity/model/transformer.py): `layer_weights` does both reshards for one layer where it
runs, forward and backward; the checkpoint policy keeps no gathered weight for the backward,
which gathers each layer again. Embeddings, the final norm and the MLP's weights are gathered
once, at the top. What XLA:CPU compiles that to is in docs/typed.md. Compare explicit/fsdp.py.
"""

import jax
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import FSDP
from shard_parity.placement import (
    FSDP_BATCH,
    layer_specs,
    outside_layers,
    reduced_over,
    reduced_specs,
    state_specs,
)
from shard_parity.placement import named, without
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'fsdp'  # --strategy=fsdp: each array split on its first dimension over 'fsdp'


def gather(shard, spec, mesh, plan, held=None):  # f32[784@fsdp, 512] -> f32[784, 512]{R:fsdp}
    whole = jax.reshard(  # the all-gather: a reshard to `spec`, of the shard cast to --dtype
        as_dtype(shard, plan.precision.compute), named(mesh, spec)
    )
    return whole if held is None else as_dtype(whole, held)  # held in `held` where used


def scatter(grad, spec, mesh, plan):  # f32[784, 512]{U:fsdp} -> spec's split f32[784@fsdp, 512]
    # the reduce-scatter in the types, in --reduce_dtype: each device keeps its shard's sum
    return jax.reshard(as_dtype(grad, plan.precision.reduce), named(mesh, spec))


def reduced(w, spec, axes=(FSDP,), path=()):  # f32[C@fsdp, 4C] -> f32[C, 4C]{R:fsdp}; a vector:
    whole = without(spec, FSDP)  # whole (reduced_specs); not over an axis it is split over
    over = reduced_over(path, axes) - set(whole)
    return P(*whole, reduced=over) if w.ndim >= 2 and over else whole


def gather_layer(specs, mesh, plan, axes=(FSDP,)):
    """`layer_weights` for the model (none without stacked layers): one layer's shards -> its
    whole weights, where the layer runs; their gradient -> the shards' sum, in the backward
    (in the shards' float32). `axes`: what the whole weights are `reduced` over (HSDP's too:
    typed/composed.py)."""

    @jax.custom_vjp
    def layer_weights(shards):  # the layer's all-gathers
        wholes = jax.tree_util.tree_map_with_path(  # their types once gathered: {R:axes}
            lambda p, w, s: reduced(w, s, axes, p), shards, specs
        )
        return jax.tree.map(lambda w, s: gather(w, s, mesh, plan), shards, wholes)

    def backward(_, grads):  # the layer's reduce-scatters, inside the backward's loop
        scattered = jax.tree.map(lambda g, s: scatter(g, s, mesh, plan), grads, specs)
        return (as_dtype(scattered, plan.precision.param),)

    layer_weights.defvjp(lambda shards: (layer_weights(shards), None), backward)
    return {} if specs is None else {'layer_weights': layer_weights}


def gather_outside(params, specs, mesh, plan):
    """The weights outside the layers (the embeddings, the final norm; all of the MLP), each
    gathered as a layer is, once, and held in float32 where it is used: the policy looks the
    rows up in a float32 table, whose gradient, a scatter-add, adds in float32 (a table used in
    bf16 had its gradient formed in bf16: auto/'s partitioner reduced it there, before any cast).
    Reduced over the plan's batch axes (HSDP's too). `specs`, the shards' layout, is not needed
    here (their types carry it): the twins' gather_outside take the same arguments."""
    wholes = reduced_specs(params, mesh, plan, gathered=True)  # reduced over the batch axes
    return outside_layers(gather, params, wholes, mesh=mesh, plan=plan, held=plan.precision.param)


def loss_and_grads(graphdef, loss_fn, mesh, plan):

    def fn(params, batch):  # params: f32[784@fsdp, 512] (1/n of each); batch: x f32[B@fsdp, 784]
        specs = state_specs(params, plan, mesh)
        call = gather_layer(layer_specs(specs), mesh, plan)  # the per-layer gather, if stacked
        grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, **call), has_aux=True)
        params = gather_outside(params, specs, mesh, plan)  # the all-gathers outside
        # the layers' reduce-scattered already
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = outside_layers(scatter, grads, specs, mesh=mesh, plan=plan)  # the rest's
        return metrics, grads  # the metrics' type: replicated (their all-reduce)

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is their type


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates its own shards
    return make_train_step(  # moves: reshard
        loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan, place=jax.reshard
    )


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # gather the weights; per-example outputs stay split
        params = jax.reshard(params, named(mesh, without(state_specs(params, plan, mesh), FSDP)))
        return jax.reshard(fn(params, batch), named(mesh, FSDP_BATCH))

    return jax.jit(evaluate)
