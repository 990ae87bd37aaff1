"""FSDP and tensor parallelism together, written by hand, on a DATA x MODEL mesh.

Each weight is first split for tensor parallelism over 'model' (explicit/tp.py), and that slice
again over 'data' (shard_parity/placement.py): a column-parallel kernel f32[in, out] lives as
f32[in/d, out/m]. Each step all-gathers it over 'data' into this device's tensor-parallel slice
f32[in, out/m] (explicit/fsdp.py's `gather`), runs the tensor-parallel model (explicit/tp.py's
`sum_partials`, its psums over 'model'), and reduce-scatters the gradient over 'data'
(`scatter`). Compare auto/fsdp_tp.py.
"""

import jax

from explicit.fsdp import gather, scatter
from explicit.tp import sum_partials
from shard_parity.mesh import DATA
from shard_parity.placement import BATCH, REPLICATED, state_specs
from shard_parity.step import bind, make_train_step

STRATEGY = 'fsdp_tp'  # --strategy=fsdp_tp: tp's split over 'model', fsdp's over 'data'


def loss_and_grads(graphdef, loss_fn, mesh):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, sum_partials=sum_partials), has_aux=True)
    n = mesh.shape[DATA]

    def fn(params, batch):  # params: 1/d of each tp slice; batch: x[B/d, ...], this group's rows
        specs = state_specs(params, STRATEGY, mesh)  # from the global shapes, outside

        def local(shards, batch):
            params = jax.tree.map(gather, shards, specs)  # the all-gathers over 'data'
            (_, metrics), grads = grad_fn(params, batch)  # with the psums over 'model'
            grads = jax.tree.map(lambda g, s: scatter(g, s, n), grads, specs)  # reduce-scatters
            return jax.lax.pmean(metrics, DATA), grads  # the metrics' all-reduce

        return jax.shard_map(
            local, mesh=mesh, in_specs=(specs, BATCH), out_specs=(REPLICATED, specs)
        )(params, batch)

    return jax.jit(fn)


def train_step(graphdef, loss_fn, tx, mesh):
    # the gradients, then the shared update: each device updates its own shards
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh), tx, mesh, STRATEGY)


def eval_step(graphdef, eval_fn, mesh):
    fn = bind(graphdef, eval_fn, sum_partials=sum_partials)

    def evaluate(params, batch):  # the all-gathers and psums; per-example outputs stay split
        specs = state_specs(params, STRATEGY, mesh)
        local = lambda shards, batch: fn(jax.tree.map(gather, shards, specs), batch)  # noqa: E731
        return jax.shard_map(local, mesh=mesh, in_specs=(specs, BATCH), out_specs=BATCH)(
            params, batch
        )

    return jax.jit(evaluate)
