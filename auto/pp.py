"""Pipeline parallelism the compiler writes: GPipe as a shifting buffer sharded over 'stage'.

On a DATA x STAGE mesh (`--mesh=2x4 --microbatches=4`) the transformer's stacked blocks are
placed with their layer dimension split over 'stage' (`P('stage')`, shard_parity/placement.py):
each stage device holds L/S consecutive layers. The embedding, the final norm and the head are
whole on every device, as in dp: they are a small part of the model, and every stage device
computing them (on its rows) costs less than the activations' round trip it saves. The step
holds one buffer of S microbatch activations, f32[S, B/M, T, C] @ P('stage', 'data'): slot s
is what stage s works on. At every tick all stages run at once (`vmap` over the stage
dimension, `spmd_axis_name='stage'`: each device runs its own slot with its own layers), then
`pass_on` shifts the buffer one slot down, and stage 0's slot takes the next microbatch. The
shift moves data between the 'stage' devices, and XLA writes it as a collective-permute
(python -m inspector --strategy=pp shows it); the backward is `grad`'s. Bubble
slots hold zeros that nothing reads, so their gradients are zeros. Compare explicit/pp.py.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import STAGE
from shard_parity.pipeline import feed, in_first_slot, join, microbatch_means, split
from shard_parity.placement import BATCH, REPLICATED, activations, state_shardings
from shard_parity.step import as_dtype, bind, make_train_step

STRATEGY = 'pp'  # --strategy=pp: the stacked layers split into stages over 'stage'


def pass_on(y, mesh, plan):  # f32[S, B/M, T, C]: slot i's output to slot i + 1 (the last: none)
    y = jnp.concatenate([jnp.zeros_like(y[:1]), y[:-1]])  # XLA: a collective-permute
    return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P(STAGE, *activations(plan))))


def pipeline(plan, mesh):
    """The model's `pipeline`: x f32[B, T, C] @ `layout` (P('data')) through all L layers, S
    stages."""
    microbatches = plan.microbatches  # --microbatches: M, each row device's rows cut into M

    def run(x, run_stack, weights):  # weights: f32[L, ...] @ P('stage')
        s, n = jnp.arange(mesh.shape[STAGE]), mesh.shape[STAGE]  # every slot's stage
        weights = jax.tree.map(lambda w: w.reshape(n, -1, *w.shape[1:]), weights)  # [S, L/S, ...]
        stages = jax.vmap(run_stack, spmd_axis_name=STAGE)  # stage s on slot s, on its device
        inputs = in_first_slot(split(x, microbatches), mesh, plan)  # [M, S, B/M, T, C], slot 0

        def tick(h, x):  # h, x: f32[S, B/M, T, C] @ P('stage', 'data'); h shifted, x slot 0's
            y, stats = stages(weights, h + x)  # stage 0: a new one (h's slot 0: the shift's zeros)
            return pass_on(y, mesh, plan), (y, stats)  # every slot: taking one moves it per tick

        h = jnp.zeros_like(inputs[0])  # bubbles: zeros
        _, (ys, stats) = jax.lax.scan(tick, h, feed(inputs, n))  # [M+S-1, S, B/M, T, C]
        means = microbatch_means(stats, microbatches, s)  # experts' statistics: [S, L/S]
        # the last stage's, from tick S - 1 on: XLA sends them round
        return join(ys[n - 1 :, -1]), {k: v.mean() for k, v in means.items()}

    return run


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    call = {'pipeline': pipeline(plan, mesh)}
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, **call), has_aux=True)

    def fn(params, batch):  # blocks [L, ...] @ P('stage'), the rest @ P(); x[B, T] @ P('data')
        (_, metrics), grads = grad_fn(params, batch)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        # grads @ the params' layout: the stage's layers' stay on their stage; the rest (and
        # the metrics) XLA all-reduces over 'data', each device having seen only its rows.
        grads = jax.lax.with_sharding_constraint(grads, state_shardings(grads, mesh, plan))
        return jax.lax.with_sharding_constraint(metrics, NamedSharding(mesh, REPLICATED)), grads

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is the in_shardings


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each stage updates its own layers
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn, pipeline=pipeline(plan, mesh))

    def evaluate(params, batch):  # per-sequence outputs, split over 'data'
        return jax.lax.with_sharding_constraint(fn(params, batch), NamedSharding(mesh, BATCH))

    return jax.jit(evaluate)
