"""Pipeline parallelism in JAX's Explicit mode: the stages are a typed dimension, the shift Manual.

On a DATA x STAGE mesh the stacked blocks' type is `f32[L@stage, ...]`: each stage device holds
L/S consecutive layers (shard_parity/placement.py). The embedding, the final norm and the head
are whole on every device, as in dp: they are a small part of the model, and every stage device
computing them (on its rows) costs less than the activations' round trip it saves; `reduced`
over 'data' (a free cast), their gradients come out `unreduced` and one `reshard` adds them.
The step holds one buffer of S microbatch activations, `f32[S@stage, B/M@data, T, C]`: slot s is
what stage s works on. At every tick all stages run at once (`vmap` over the stage dimension,
`spmd_axis_name='stage'`), then `pass_on` shifts the buffer one slot down and stage 0's slot
takes the next microbatch. Explicit mode has no type for "pass my slot to the next device", so
the shift drops to Manual mode, `jax.shard_map` around one ppermute, as explicit/pp.py's; the
backward is `grad`'s. Bubble slots hold zeros that nothing reads. Compare auto/pp.py.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import STAGE
from shard_parity.pipeline import feed, in_first_slot, in_mesh, join, microbatch_means, split
from shard_parity.placement import (
    BATCH,
    activations,
    outside_layers,
    reduced_shardings,
    state_shardings,
)
from shard_parity.step import as_dtype, bind, make_train_step

STRATEGY = 'pp'  # --strategy=pp: the stacked layers split into stages over 'stage'


def pass_on(y, mesh, plan):  # f32[S@stage, B/M@data, T, C]: slot i's output goes to slot i + 1
    def shift(y):  # Manual mode: f32[1, B/dM, T, C], my slot
        n = jax.lax.axis_size(STAGE)
        return jax.lax.ppermute(y, STAGE, [(i, i + 1) for i in range(n - 1)])  # collective-permute

    spec = P(STAGE, *activations(plan))
    return jax.shard_map(shift, mesh=mesh, in_specs=spec, out_specs=spec)(y)


def behind(w, mesh, *lead):  # f32[L@stage, ...]'s layout after L (the other axes'), behind `lead`
    spec = jax.typeof(w).sharding.spec
    return NamedSharding(mesh, P(*lead, *spec.partitions[1:], reduced=spec.reduced))


def pipeline(plan, mesh):
    """The model's `pipeline`: x f32[B@data, T, C] (its `layout`) through all L layers, S
    stages."""
    microbatches = plan.microbatches  # --microbatches: M, each row device's rows cut into M

    def run(x, run_stack, weights):  # weights: f32[L@stage, ...]
        s, n = jnp.arange(mesh.shape[STAGE]), mesh.shape[STAGE]  # every slot's stage
        if n == 1:  # no pipeline (check_pp warns), and vmap trips on a size-1 Explicit axis
            weights = jax.tree.map(lambda w: jax.reshard(w, behind(w, mesh, None)), weights)  # [L]
            ys, stats = jax.lax.map(lambda x: run_stack(weights, x), split(x, microbatches))
            return join(ys), {k: v.mean() for k, v in stats.items()}
        weights = jax.tree.map(  # [S@stage, L/S, ...], each keeping its other axes' splits
            lambda w: w.reshape(n, -1, *w.shape[1:], out_sharding=behind(w, mesh, STAGE, None)),
            weights,
        )
        stages = jax.vmap(in_mesh(run_stack, mesh), spmd_axis_name=STAGE)  # slot s, its device
        inputs = in_first_slot(split(x, microbatches), mesh, plan)  # [M, S@stage, B/M@data, T, C]

        def tick(h, x):  # h, x: f32[S@stage, B/M@data, T, C]; h shifted, x slot 0's
            y, stats = stages(weights, h + x)  # stage 0: a new one (h's slot 0: the shift's zeros)
            return pass_on(y, mesh, plan), (y, stats)  # every slot: a slice of one needs it whole

        h = jnp.zeros_like(inputs[0])  # bubbles: zeros
        _, (ys, stats) = jax.lax.scan(tick, h, feed(inputs, n))  # [M+S-1, S@stage, ...]
        means = microbatch_means(stats, microbatches, s)  # experts' statistics: [S, L/S]
        last = (s == n - 1)[:, None, None, None]  # the last stage's slot, from tick S - 1 on:
        return join(jnp.where(last, ys[n - 1 :], 0).sum(1)), {  # an all-reduce
            k: v.mean() for k, v in means.items()
        }

    return run


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    call = {'pipeline': pipeline(plan, mesh)}
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, **call), has_aux=True)

    def fn(params, batch):  # params: blocks f32[L@stage, ...], the rest whole; x i32[B@data, T]
        # Free: reduced over 'data', so the gradients come out unreduced over 'data'. Not the
        # blocks: vmap refuses a reduced operand (a bug in jax 0.10 to 0.12, docs/pipeline.md),
        # so their gradients are summed over 'data' where they are formed, at every tick.
        params = outside_layers(jax.reshard, params, reduced_shardings(params, mesh, plan))
        (_, metrics), grads = grad_fn(params, batch)  # grads: f32[...]{U:data}
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return metrics, jax.reshard(grads, state_shardings(grads, mesh, plan))  # all-reduce

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is their type


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each stage updates its own layers
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan, place=jax.reshard)  # moves: reshard


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn, pipeline=pipeline(plan, mesh))

    def evaluate(params, batch):  # per-sequence outputs f32[B@data]
        return jax.reshard(fn(params, batch), NamedSharding(mesh, BATCH))

    return jax.jit(evaluate)
