"""Pipeline parallelism written by hand: GPipe, one ppermute per tick, M + S - 1 ticks.

On a DATA x STAGE mesh (`--mesh=2x4 --microbatches=4`) each 'stage' device holds L/S
consecutive layers of the transformer's stacked blocks (`P('stage')` on their layer dimension,
shard_parity/placement.py) and its 'data' group's B/d rows. The embedding, the final norm and the
head are whole on every device, as in dp: they are a small part of the model, and every stage
device computing them (on its rows) costs less than the activations' round trip it saves. Each
device splits its rows into M microbatches (shard_parity/pipeline.py); at every tick each stage
runs its layers on the microbatch it holds, then `pass_on` hands the result to the next stage,
one collective-permute, while stage 0 takes the next microbatch in. The last stage's outputs
come back to every stage in one psum, and the head and loss run there. The backward is `grad`'s:
the transpose of a ppermute is the ppermute the other way, so the gradients of the activations
flow from stage i + 1 back to stage i, tick by tick in reverse. Bubble ticks run on zeros that
nothing reads, so their gradients are zeros. Compare auto/pp.py.
"""

import jax
import jax.numpy as jnp

from shard_parity.mesh import DATA, STAGE
from shard_parity.pipeline import feed, join, microbatch_means, split
from shard_parity.placement import BATCH, REPLICATED, state_specs
from shard_parity.step import as_dtype, bind, make_train_step

STRATEGY = 'pp'  # --strategy=pp: the stacked layers split into stages over 'stage'


def pass_on(y, mesh, plan):  # f32[B/dM, T, C]: stage i's output to stage i + 1 (the last: none)
    return jax.lax.ppermute(y, STAGE, [(i, i + 1) for i in range(plan.size(STAGE) - 1)])


def pipeline(plan, mesh):
    """The model's `pipeline`: x f32[B/d, T, C] through all L layers, S stages, GPipe."""
    microbatches = plan.microbatches  # --microbatches: M, each row device's rows cut into M

    def run(x, run_stack, weights):  # weights: my stage's L/S layers, [L/S, ...]
        s, n = jax.lax.axis_index(STAGE), mesh.shape[STAGE]
        # Varying over 'stage': else grad sums stage 0's input gradient over 'stage' every tick
        inputs = jax.lax.pcast(split(x, microbatches), STAGE, to='varying')  # [M, B/dM, T, C]

        def tick(h, x):  # h: what the previous stage passed me last tick; x: stage 0's input
            y, stats = run_stack(weights, jnp.where(s == 0, x, h))  # stage 0: a new one
            return pass_on(y, mesh, plan), (y, stats)  # a collective-permute

        h = jnp.zeros_like(inputs[0])  # bubbles: zeros
        _, (ys, stats) = jax.lax.scan(tick, h, feed(inputs, n))  # [M+S-1, B/dM, T, C]
        means = microbatch_means(stats, microbatches, s)  # experts' statistics: my layers'
        # the last stage's, from tick S - 1 on, to every stage: an all-reduce over 'stage'
        # ...and all layers' means: an all-reduce over 'stage'
        return join(jax.lax.psum(jnp.where(s == n - 1, ys[n - 1 :], 0), STAGE)), {
            k: jax.lax.pmean(v.mean(), STAGE) for k, v in means.items()
        }

    return run


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    call = {'pipeline': pipeline(plan, mesh)}
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, **call), has_aux=True)

    def local(params, batch):  # params: my stage's layers, the rest whole; batch: x[B/d, T]
        # As in dp: varying over 'data', each device's loss a different term. Over 'stage' the
        # blocks vary (each stage's own layers); the rest is the same on every stage device.
        params = jax.lax.pcast(params, DATA, to='varying')
        (_, metrics), grads = grad_fn(params, batch)  # grads: my stage's layers, the rest whole
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return jax.lax.pmean((metrics, grads), DATA)  # the all-reduce over 'data'

    def fn(params, batch):  # P('stage') for the blocks' layer dimension, P() the rest
        specs = state_specs(params, plan, mesh)
        return jax.shard_map(
            local, mesh=mesh, in_specs=(specs, BATCH), out_specs=(REPLICATED, specs)
        )(params, batch)

    return jax.jit(fn)


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each stage updates its own layers
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn, pipeline=pipeline(plan, mesh))

    def evaluate(params, batch):  # per-sequence outputs of my rows, the same on every stage
        specs = state_specs(params, plan, mesh)
        return jax.shard_map(fn, mesh=mesh, in_specs=(specs, BATCH), out_specs=BATCH)(params, batch)

    return jax.jit(evaluate)
