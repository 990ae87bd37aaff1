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
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import FSDP
from shard_parity.placement import (
    FSDP_BATCH,
    layer_specs,
    named,
    outside_layers,
    reduced_over,
    reduced_shardings,
    state_shardings,
    state_specs,
    without,
)
from shard_parity.step import as_dtype, bind, make_train_step

STRATEGY = 'fsdp'  # --strategy=fsdp: each array split on its first dimension over 'fsdp'


def reshard(x, mesh, spec):  # x: this layout, here; the data moves only at a reshard
    return jax.reshard(x, NamedSharding(mesh, spec))


def reduced(w, spec, axes=(FSDP,), path=()):  # f32[C@fsdp, 4C] -> f32[C, 4C]{R:fsdp}; a vector:
    whole = without(spec, FSDP)  # whole (reduced_shardings); not over an axis it is split over
    over = reduced_over(path, axes) - set(whole)
    return P(*whole, reduced=over) if w.ndim >= 2 and over else whole


def gather_layer(specs, mesh, plan, axes=(FSDP,)):
    """`layer_weights` for the model (none without stacked layers): one layer's shards -> its
    whole weights, where the layer runs; their gradient -> the shards' sum, in the backward
    (in the shards' float32). `axes`: what the whole weights are `reduced` over (HSDP's too:
    typed/composed.py)."""

    @jax.custom_vjp
    def layer_weights(shards):  # the layer's all-gathers
        shards = as_dtype(shards, plan.precision.compute)  # what the all-gather carries: --dtype
        return jax.tree_util.tree_map_with_path(
            lambda p, w, s: reshard(w, mesh, reduced(w, s, axes, p)), shards, specs
        )

    def backward(_, grads):  # {U:fsdp} -> split: the layer's reduce-scatters, in the backward
        grads = as_dtype(grads, plan.precision.reduce)  # what the reduce-scatter carries
        scattered = jax.tree.map(lambda g, s: reshard(g, mesh, s), grads, specs)
        return (as_dtype(scattered, plan.precision.param),)

    layer_weights.defvjp(lambda shards: (layer_weights(shards), None), backward)
    return {} if specs is None else {'layer_weights': layer_weights}


def gather_outside(params, mesh, plan):
    """The weights outside the layers (the embeddings, the final norm; all of the MLP), each
    gathered as a layer is, once, and held in float32 where it is used: the policy looks the
    rows up in a float32 table, whose gradient, a scatter-add, adds in float32 (a table used in
    bf16 had its gradient formed in bf16: auto/'s partitioner reduced it there, before any cast)."""
    params = outside_layers(as_dtype, params, dtype=plan.precision.compute)  # what they carry
    params = outside_layers(jax.reshard, params, reduced_shardings(params, mesh, plan, gathered=True))
    return outside_layers(as_dtype, params, dtype=plan.precision.param)


def loss_and_grads(graphdef, loss_fn, mesh, plan):

    def fn(params, batch):  # params: f32[784@fsdp, 512] (1/n of each); batch: x f32[B@fsdp, 784]
        specs = state_specs(params, plan, mesh)
        call = gather_layer(layer_specs(specs), mesh, plan)  # the per-layer gather, if stacked
        grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, **call), has_aux=True)
        params = gather_outside(params, mesh, plan)  # the all-gathers outside, in --dtype
        (_, metrics), grads = grad_fn(params, batch)  # grads: f32[784, 512]{U:fsdp}
        # unreduced -> split over 'fsdp': the reduce-scatter, each device keeps its shard's sum
        grads = as_dtype(grads, plan.precision.reduce)  # what the reduce-scatter carries
        return metrics, jax.reshard(grads, state_shardings(grads, mesh, plan))

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is their type


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates its own shards
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan, place=jax.reshard)  # moves: reshard


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # gather the weights; per-example outputs stay split
        params = jax.reshard(params, named(mesh, without(state_specs(params, plan, mesh), FSDP)))
        return jax.reshard(fn(params, batch), NamedSharding(mesh, FSDP_BATCH))

    return jax.jit(evaluate)
