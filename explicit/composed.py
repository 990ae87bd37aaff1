"""Every axis at once, written by hand: one shard_map over an N-D mesh, each collective a line
over its own axis.

`--mesh=data:2,fsdp:2,model:2` (any of data, fsdp, model, seq, stage, expert, in any order;
shard_parity/plan.py) runs this step. Each device holds its shard of every array, split by each
axis's rule (shard_parity/placement.py), and its rows of the batch: B / (data x fsdp x expert)
sequences, under 'seq' T / seq positions of each. Each axis adds its piece, taken from its own
strategy file, to the model call (`hooks`):

    fsdp    gather_layer: each layer all-gathered where it runs, its gradient reduce-scattered
    model   sum_partials: the psum of each row-parallel layer's partial sums
    seq     the ring: K/V blocks ppermuted round 'seq', flash-style (positions in zigzag order)
    expert  exchange: two all_to_alls per MoE layer, to the experts' devices and back
    stage   pipeline: GPipe over 'stage', one ppermute per tick, the hooks above inside a stage
            (--pp_schedule=1f1b|interleaved: pp_1f1b.py, the same hooks in each unit)

and the gradients are reduced once, after `grad` (`reduce`): averaged over each axis that
split the batch ('data', 'seq', and the rows of 'fsdp' and 'expert'), except where a piece did
it already ('fsdp''s reduce-scatter, the experts' all_to_all, which adds its group's terms). A
gradient is never reduced over 'model' or 'stage': those devices hold different shards of it.
Compare auto/composed.py and typed/composed.py.
"""

import jax
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import DATA, EXPERT, FSDP, MODEL, SEQ, STAGE
from shard_parity.model.ring import model_call
from shard_parity.placement import (
    activations,
    REPLICATED,
    in_layout,
    is_expert,
    layer_specs,
    outside_layers,
    state_specs,
    update_specs,
)
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

from .cp import pass_on
from .ep import exchange
from .fsdp import gather_layer, gather_outside
from .fsdp import gather, scatter
from .pp import pipeline
from .tp import sum_partials
from . import zero1

STRATEGY = 'composed'  # a named mesh: every axis the mesh names does its job


def hooks(plan, specs, mesh, batch):
    """The model call's keywords: the piece of each axis the plan uses, inside shard_map."""
    call = {}
    if plan.uses(FSDP):  # each layer gathered where it runs, in the pipeline's stages too
        call.update(gather_layer(layer_specs(specs), mesh, plan))
    if plan.uses(MODEL):
        call['sum_partials'] = sum_partials
    if plan.uses(SEQ):  # this device's positions, i32[T/n], and the ring's attention
        call.update(model_call(batch['x'].shape[1], SEQ, pass_on, plan.layout))
    if plan.uses(EXPERT):
        call['experts'] = exchange
    if plan.uses(STAGE):
        call['pipeline'] = pipeline(plan, mesh)
    return call


def averaged_over(plan, spec) -> tuple[str, ...]:
    """The batch axes a gradient (and its param, cast before `grad`) is averaged over here:
    not those it is split over, nor 'fsdp', whose gather and reduce-scatter do their own."""
    return tuple(a for a in plan.batch_axes if a not in spec and a != FSDP)


def reduce(grads, specs, to, plan):
    """The gradient all-reduces: a mean over `averaged_over`'s axes; an expert's gradient is
    already the sum over its 'expert' group (the all_to_all's transpose), so / n. Under ZeRO-1
    a gradient whose moments `to` splits over 'data' is reduce-scattered there instead."""

    def one(path, g, spec, to):  # the all-reduce over 'data' (and 'seq', the rows of 'expert')
        g, over = as_dtype(g, plan.precision.reduce), averaged_over(plan, spec)
        if to != spec:  # ZeRO-1: the reduce-scatter over 'data' (zero1.py), the rest all-reduced
            g, over = zero1.scatter(g, to, plan), tuple(a for a in over if a != DATA)
        g = jax.lax.pmean(g, over)
        return g / plan.size(EXPERT) if is_expert(path) else g

    return jax.tree_util.tree_map_with_path(one, grads, specs, to)


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    def body(params, batch, specs, to):  # params: my shard of each array; batch: x[B/rows, T/seq]
        call = hooks(plan, specs, mesh, batch)
        grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, **call), has_aux=True)
        # As dp's pcast: varying over the batch axes, so that `grad` returns this device's own
        # term (over 'fsdp' `gather` casts; an expert is varying over 'expert' already).
        params = jax.tree.map(
            lambda w, s: jax.lax.pcast(w, averaged_over(plan, s), to='varying'), params, specs
        )
        params = gather_outside(params, specs, mesh, plan) if plan.uses(FSDP) else params
        # every axis's collectives inside
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        if plan.uses(FSDP):  # the reduce-scatters of the weights outside the layers
            grads = outside_layers(scatter, grads, specs, mesh=mesh, plan=plan)
        return jax.lax.pmean(metrics, plan.batch_axes), reduce(grads, specs, to, plan)

    def fn(params, batch):  # shard_map's body on each device (the specs from the global shapes)
        specs = state_specs(params, plan, mesh)
        to = update_specs(params, plan, mesh)  # the gradients' layout: the moments'
        return jax.shard_map(
            lambda params, batch: body(params, batch, specs, to),
            mesh=mesh,
            in_specs=(specs, P(*activations(plan))),
            out_specs=(REPLICATED, to),
        )(params, in_layout(batch, plan))  # under 'seq' the positions in the layout's order

    return jax.jit(fn)


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates the shards it holds
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan, gather=zero1.gather)


def eval_step(graphdef, eval_fn, mesh, plan):
    def body(params, batch, specs):  # per-example outputs of my rows, the same on other axes
        call = hooks(plan, specs, mesh, batch)
        call.pop('layer_weights', None)  # all the all-gathers up front, below
        if plan.uses(FSDP):
            params = jax.tree.map(lambda w, s: gather(w, s, mesh, plan), params, specs)
        out = bind(graphdef, eval_fn, **call)(params, batch)
        return jax.lax.pmean(out, SEQ) if plan.uses(SEQ) else out  # the parts' means

    def evaluate(params, batch):
        specs = state_specs(params, plan, mesh)
        return jax.shard_map(
            lambda params, batch: body(params, batch, specs),
            mesh=mesh,
            in_specs=(specs, P(*activations(plan))),
            out_specs=P(activations(plan)[0]),
        )(params, in_layout(batch, plan))

    return jax.jit(evaluate)
