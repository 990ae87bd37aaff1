"""Expert parallelism in JAX's Explicit mode: the experts' slots change type, by expert.

On a DATA x EXPERT mesh the rows' type is `i32[B@(data,expert), T]`, each expert's weights are
split on E over 'expert' (`f32[L, E@expert, C, 4C]`: E/n experts per device), and the other
weights are whole on every device (`reduced` over both axes, a free cast, so their gradients
come out `unreduced` and one `reshard` adds them: the all-reduce, as typed/dp.py). The model
gathers each expert's tokens with one einsum (shard_parity/model/moe.py), xe:
`f32[E, B@(data,expert), cap, C]`; `exchange` below reshards it to `f32[E@expert, B@data, cap,
C]`, where each device holds its experts' slots (the exchange: data moves only at a reshard),
runs the experts there, and reshards the outputs back. Compare explicit/ep.py's all_to_all.
"""

import jax
from jax.sharding import NamedSharding

from shard_parity.placement import (
    expert_slots,
    reduced_shardings,
    row_slots,
    rows,
    state_shardings,
)
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'ep'  # --strategy=ep: experts split over 'expert', the rows over both axes


def exchange(xe, experts, mesh, plan):  # xe: f32[E, B@(data,expert), cap, C]
    # to the experts' devices: f32[E@expert, B@data, cap, C], an all-to-all over 'expert'
    x = jax.reshard(xe, NamedSharding(mesh, expert_slots(plan)))
    y = experts(x)  # each device runs its E/n experts on their slots
    # back to the tokens' devices: the second exchange
    return jax.reshard(y, NamedSharding(mesh, row_slots(plan)))


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    hook = bind(graphdef, loss_fn, experts=lambda xe, w: exchange(xe, w, mesh, plan))
    grad_fn = jax.value_and_grad(hook, has_aux=True)

    def fn(params, batch):  # params: whole, experts f32[L, E@expert, ...]; batch: x[B@data, T]
        batch = jax.reshard(batch, NamedSharding(mesh, rows(plan)))
        # Free: reduced (experts over 'data' only), so the gradients come out unreduced.
        params = jax.reshard(params, reduced_shardings(params, mesh, plan))
        # grads: f32[C, E]{U:(data, expert)}
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return metrics, jax.reshard(grads, state_shardings(grads, mesh, plan))  # all-reduce

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is their type


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates the arrays or experts it holds
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan, place=jax.reshard)  # moves: reshard


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn, experts=lambda xe, w: exchange(xe, w, mesh, plan))

    def evaluate(params, batch):  # per-example outputs f32[B@(data,expert)]
        batch = jax.reshard(batch, NamedSharding(mesh, rows(plan)))
        return jax.reshard(fn(params, batch), NamedSharding(mesh, rows(plan)))

    return jax.jit(evaluate)
