"""explicit/fsdp.py with the reduce-scatter's division by n left out (the bug zoo)."""

import jax

from shard_parity.mesh import DATA
from shard_parity.placement import BATCH, REPLICATED, state_specs
from shard_parity.step import bind, make_train_step

STRATEGY = 'fsdp'  # --strategy=fsdp: each array split on its first dimension over 'data'


def gather(shard, spec):  # a weight's shard f32[d/n, ...] -> the whole weight f32[d, ...]
    if DATA not in spec:  # a small array kept whole (a bias of odd size): cast as in dp
        return jax.lax.pcast(shard, DATA, to='varying')
    return jax.lax.all_gather(shard, DATA, axis=spec.index(DATA), tiled=True)  # all-gather


def scatter(grad, spec, n):  # the local gradient of a whole weight -> the mean for my shard
    if DATA not in spec:
        return jax.lax.pmean(grad, DATA)  # all-reduce
    return jax.lax.psum_scatter(
        grad, DATA, scatter_dimension=spec.index(DATA), tiled=True
    )  # BUG: / n


def loss_and_grads(graphdef, loss_fn, mesh):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)
    n = mesh.shape[DATA]

    def fn(params, batch):  # params: 1/n of each array; batch: x[B/n, ...], this device's rows
        specs = state_specs(params, STRATEGY, mesh)  # from the global shapes, outside

        def local(shards, batch):
            params = jax.tree.map(gather, shards, specs)  # the all-gathers
            (_, metrics), grads = grad_fn(params, batch)  # the gradient of my rows
            grads = jax.tree.map(lambda g, s: scatter(g, s, n), grads, specs)  # reduce-scatters
            return jax.lax.pmean(metrics, DATA), grads  # the metrics' all-reduce

        return jax.shard_map(
            local, mesh=mesh, in_specs=(specs, BATCH), out_specs=(REPLICATED, specs)
        )(params, batch)

    return jax.jit(fn)


def train_step(graphdef, loss_fn, tx, mesh):
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh), tx, mesh, STRATEGY)


def eval_step(graphdef, eval_fn, mesh):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # the all-gathers; per-example outputs stay split
        specs = state_specs(params, STRATEGY, mesh)
        local = lambda shards, batch: fn(jax.tree.map(gather, shards, specs), batch)  # noqa: E731
        return jax.shard_map(local, mesh=mesh, in_specs=(specs, BATCH), out_specs=BATCH)(
            params, batch
        )

    return jax.jit(evaluate)
