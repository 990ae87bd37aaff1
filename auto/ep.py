"""Expert parallelism the compiler writes: we say where the experts' slots live, XLA moves them.

On a DATA x EXPERT mesh (`--mesh=2x4`) the rows are split over both axes (`P(('data',
'expert'))`), each expert's weights live on one device of the 'expert' axis (`P(None,
'expert')` of the stacked f32[L, E, ...]: E/n experts each), and every other weight is whole
on every device, as in dp. The model routes the tokens and gathers them per expert with one
einsum (shard_parity/model/moe.py), xe: [E, B, cap, C], split like the rows. `exchange` below
asks for it split by expert instead (`P('expert', 'data')`), runs the experts there, keeps
their outputs there, and asks for them split like the rows again: between the constraints the
partitioner must move every slot to its expert's device and back, and it picks the collectives
(python -m inspector --strategy=ep shows them). What it chose (jax 0.10.2, CPU):
the same two all-to-alls per layer forward and two backward as explicit/ep.py; without the
middle constraint it ran the experts' second matmul in the rows' layout and all-gathered the
experts' weights for it (docs/experts.md). The experts' gradients stay split; the others are
all-reduced. Compare explicit/ep.py.
"""

import jax
from jax.sharding import NamedSharding

from shard_parity.placement import (
    REPLICATED,
    expert_slots,
    named,
    row_slots,
    rows,
    state_specs,
)
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'ep'  # --strategy=ep: experts split over 'expert', the rows over both axes


def exchange(xe, experts, mesh, plan):  # xe: [E, B, cap, C] @ P(None, ('data', 'expert'))
    # to the experts' devices: XLA inserts the exchange (an all-to-all over 'expert')
    x = jax.lax.with_sharding_constraint(xe, NamedSharding(mesh, expert_slots(plan)))
    # each device runs its E/n experts on their slots; the outputs stay there (unpinned, XLA
    # computed them in the rows' layout and all-gathered the experts' weights for it)
    y = jax.lax.with_sharding_constraint(experts(x), NamedSharding(mesh, expert_slots(plan)))
    # back to the tokens' devices: the second exchange
    return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, row_slots(plan)))


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    hook = bind(graphdef, loss_fn, experts=lambda xe, w: exchange(xe, w, mesh, plan))
    grad_fn = jax.value_and_grad(hook, has_aux=True)

    def fn(params, batch):  # params @ P(), experts @ P(None, 'expert'); batch: x[B, T]
        batch = jax.lax.with_sharding_constraint(batch, NamedSharding(mesh, rows(plan)))
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        # metrics @ P(), grads as the params: each device saw only its rows, so XLA all-reduces
        # the replicated weights' gradients over both axes, the experts' over 'data'
        return jax.lax.with_sharding_constraint(
            (metrics, grads), named(mesh, (REPLICATED, state_specs(grads, plan, mesh)))
        )

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is the in_shardings


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates the arrays or experts it holds
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn, experts=lambda xe, w: exchange(xe, w, mesh, plan))

    def evaluate(params, batch):  # per-example outputs stay split like the rows
        batch = jax.lax.with_sharding_constraint(batch, NamedSharding(mesh, rows(plan)))
        return jax.lax.with_sharding_constraint(fn(params, batch), NamedSharding(mesh, rows(plan)))

    return jax.jit(evaluate)
