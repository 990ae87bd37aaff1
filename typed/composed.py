"""Every axis at once in JAX's Explicit mode: the types carry each axis's split, a reshard
moves data, and Manual mode only where no type says the move (the ring, the pipeline's shift).

`--mesh=data:2,fsdp:2,model:2` (any of data, fsdp, model, seq, stage, expert, in any order;
shard_parity/plan.py) runs this step. Each array's type is split by each axis's rule
(shard_parity/placement.py), the batch's by its rows over the row axes (and under 'seq' each
row's positions). Each axis adds its piece, taken from its own strategy file (`hooks`):

    fsdp    gather_layer: each layer resharded whole where it runs, its gradient split again
    model   sum_partials: each row-parallel layer's `unreduced` partial sums resharded, added
    seq     ring: shard_map round 'seq' for attention only (positions in zigzag order)
    expert  exchange: the experts' slots resharded by expert, then by row again
    stage   pipeline: the buffer f32[S@stage, ...], the stages vmapped, the shift a shard_map

and the gradients: every weight is `reduced` over the batch axes it is not split over (a free
cast; under 'fsdp' the gather's type), so its gradient comes out `unreduced`, and one reshard
to the state's layout adds them (and under 'fsdp' scatters them). Compare explicit/composed.py.
"""

import jax
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import EXPERT, FSDP, MODEL, SEQ, STAGE
from shard_parity.placement import (
    activations,
    in_layout,
    layer_specs,
    named,
    outside_layers,
    reduced_shardings,
    state_specs,
    update_specs,
    without,
)
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

from .cp import ring
from .ep import exchange
from .fsdp import gather_layer, gather_outside
from .pp import pipeline
from .tp import sum_partials
from . import zero1

STRATEGY = 'composed'  # a named mesh: every axis the mesh names does its job


def hooks(plan, specs, mesh, batch):
    """The model call's keywords: the piece of each axis the plan uses."""
    call = {}
    if plan.uses(FSDP):  # each layer gathered where it runs, reduced over every batch axis
        call.update(gather_layer(layer_specs(specs), mesh, plan, plan.batch_axes))
    if plan.uses(MODEL):
        call['sum_partials'] = sum_partials
    if plan.uses(SEQ):  # the positions, i32[T], and the ring's attention: heads over 'model'
        heads = MODEL if plan.uses(MODEL) else None
        call.update(ring(batch['x'].shape[1], mesh, plan.layout, P(*activations(plan), heads)))
    if plan.uses(EXPERT):
        call['experts'] = lambda xe, w: exchange(xe, w, mesh, plan)
    if plan.uses(STAGE):
        call['pipeline'] = pipeline(plan, mesh)
    return call


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    def body(params, batch, specs, to):  # params: f32[in@fsdp, out@model]; batch: x i32[B@rows, T]
        call = hooks(plan, specs, mesh, batch)
        grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, **call), has_aux=True)
        # Free (and the all-gather over 'fsdp'): reduced over the batch axes, so the gradients
        # come out unreduced. Not the blocks under 'fsdp' (gather_layer's, per layer) nor under
        # 'stage': vmap refuses a reduced operand (a JAX bug, docs/pipeline.md; typed/pp.py).
        if plan.uses(FSDP):  # the all-gathers in --dtype, held in float32 (typed/fsdp.py's)
            params = gather_outside(params, specs, mesh, plan)
        else:
            cast = outside_layers if plan.uses(STAGE) else jax.tree.map
            params = cast(jax.reshard, params, reduced_shardings(params, mesh, plan))
        # grads: f32[in, out@model]{U:(data, ...)}
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        # unreduced -> the state's layout: the all-reduces (over 'fsdp' the reduce-scatters)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return metrics, jax.reshard(grads, named(mesh, to))  # ZeRO-1: to 1/n (zero1.py)

    def fn(params, batch):  # the step's body, on the arrays as typed (the specs from them)
        specs = state_specs(params, plan, mesh)
        to = update_specs(params, plan, mesh)  # the gradients' layout: the moments'
        # under 'seq' the positions in the layout's order first: a local gather of whole rows
        batch = jax.reshard(in_layout(batch, plan), named(mesh, P(*activations(plan))))
        return body(params, batch, specs, to)

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is their type


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates the shards it holds
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan, place=jax.reshard, gather=zero1.gather)


def eval_step(graphdef, eval_fn, mesh, plan):
    def body(params, batch, specs):  # per-example outputs f32[B@rows]
        call = hooks(plan, specs, mesh, batch)
        call.pop('layer_weights', None)  # all the all-gathers up front, below
        if plan.uses(FSDP):  # every weight gathered over 'fsdp', as typed/fsdp.py's eval
            params = jax.reshard(params, named(mesh, without(specs, FSDP)))
        out = bind(graphdef, eval_fn, **call)(params, batch)
        return jax.reshard(out, named(mesh, P(activations(plan)[0])))

    def evaluate(params, batch):
        specs = state_specs(params, plan, mesh)
        batch = jax.reshard(in_layout(batch, plan), named(mesh, P(*activations(plan))))
        return body(params, batch, specs)

    return jax.jit(evaluate)
