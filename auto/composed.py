"""Every axis at once, the compiler writing the collectives: placements on an N-D mesh, and a
constraint where an axis needs one.

`--mesh=data:2,fsdp:2,model:2` (any of data, fsdp, model, seq, stage, expert, in any order;
shard_parity/plan.py) runs this step. Each array is placed split by each axis's rule
(shard_parity/placement.py), the batch by its rows over the row axes (and under 'seq' each
row's positions), and XLA's partitioner inserts what the placements imply. Each axis that
needs more than a placement adds its piece, taken from its own strategy file (`hooks`):

    fsdp    gather_layer: each layer constrained whole where it runs, its gradient split again
    model   nothing: Megatron's placement alone (XLA adds the row-parallel layers' partial sums)
    seq     nothing: the positions placed over 'seq' (XLA moves what attention needs)
    expert  exchange: the experts' slots constrained by expert, then by row again
    stage   pipeline: GPipe as a buffer shifted over 'stage', the stages vmapped

and the gradients are asked for in the params' layout, so that XLA reduces each over the axes
that split the batch to the shard its device keeps. Compare explicit/composed.py.
"""

import jax
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import EXPERT, FSDP, STAGE
from shard_parity.placement import activations, REPLICATED, layer_specs, named, state_specs
from shard_parity.placement import update_specs
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

from .ep import exchange
from .fsdp import gather_layer, gather_outside
from .pp import pipeline
from . import zero1

STRATEGY = 'composed'  # a named mesh: every axis the mesh names does its job


def hooks(plan, specs, mesh, batch):
    """The model call's keywords: the piece of each axis the plan uses."""
    call = {}
    if plan.uses(FSDP):  # each layer gathered where it runs, in the pipeline's stages too
        call.update(gather_layer(layer_specs(specs), mesh, plan))
    if plan.uses(EXPERT):
        call['experts'] = lambda xe, w: exchange(xe, w, mesh, plan)
    if plan.uses(STAGE):
        call['pipeline'] = pipeline(plan, mesh)
    return call


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    def body(params, batch, specs, to):  # params @ each axis's split; batch: x[B, T] @ P(rows)
        call = hooks(plan, specs, mesh, batch)
        grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, **call), has_aux=True)
        params = gather_outside(params, specs, mesh, plan) if plan.uses(FSDP) else params
        # XLA inserts every axis's collectives
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        # grads in the moments' layout: XLA reduces each over the batch's axes to its shard
        # (under ZeRO-1 split over 'data' too: a reduce-scatter, zero1.py)
        grads = jax.lax.with_sharding_constraint(grads, named(mesh, to))
        return jax.lax.with_sharding_constraint(metrics, named(mesh, REPLICATED)), grads

    def fn(params, batch):  # the step's body, on the arrays as placed (the specs from them)
        specs = state_specs(params, plan, mesh)
        to = update_specs(params, plan, mesh)  # the gradients' layout: the moments'
        batch = jax.lax.with_sharding_constraint(batch, named(mesh, P(*activations(plan))))
        return body(params, batch, specs, to)

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is the in_shardings


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates the shards it holds
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan, gather=zero1.gather)


def eval_step(graphdef, eval_fn, mesh, plan):
    def body(params, batch, specs):  # per-example outputs, split like the rows
        call = hooks(plan, specs, mesh, batch)
        call.pop('layer_weights', None)  # XLA gathers the weights where they are used
        out = bind(graphdef, eval_fn, **call)(params, batch)
        return jax.lax.with_sharding_constraint(out, named(mesh, P(activations(plan)[0])))

    def evaluate(params, batch):
        specs = state_specs(params, plan, mesh)
        batch = jax.lax.with_sharding_constraint(batch, named(mesh, P(*activations(plan))))
        return body(params, batch, specs)

    return jax.jit(evaluate)
