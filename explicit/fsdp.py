"""FSDP (ZeRO-3) written by hand: every device keeps 1/n of each weight and of its optimizer
state, all-gathers a weight to use it, and reduce-scatters its gradient back to the shards.

Compare auto/fsdp.py. Inside shard_map, `all_gather` returns a value that varies per device,
so `grad` gives each device the gradient of its own rows (no implicit psum, no pcast needed);
`psum_scatter` then sums the n gradients and leaves each device the sum for its own shard.
explicit/fsdp_tp.py runs these same functions with tensor parallelism's model and placement.
"""

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import DATA
from shard_parity.placement import state_specs
from shard_parity.step import TrainState, apply_gradients, bind

STRATEGY = 'fsdp'  # --strategy=fsdp
BATCH = P(DATA)  # split the leading (example) dimension across the 'data' axis
REPLICATED = P()  # no axis named: every device holds the whole array


def state_shardings(state, mesh, strategy=STRATEGY):
    """The same placement as auto/fsdp.py (shard_parity/placement.py)."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), state_specs(state, strategy, mesh))


def place_state(state: TrainState, mesh, strategy=STRATEGY) -> TrainState:
    return jax.device_put(state, state_shardings(state, mesh, strategy))


def place_batch(batch, mesh):
    sharding = NamedSharding(mesh, BATCH)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)


def gather(shard, spec):  # a weight's shard f32[d/n, ...] -> the whole weight f32[d, ...]
    if DATA not in spec:  # a small array kept whole (a bias of odd size): cast as in dp
        return jax.lax.pcast(shard, DATA, to='varying')
    return jax.lax.all_gather(shard, DATA, axis=spec.index(DATA), tiled=True)


def scatter(grad, spec, n):  # the local gradient of a whole weight -> the mean for my shard
    if DATA not in spec:
        return jax.lax.pmean(grad, DATA)  # all-reduce
    return jax.lax.psum_scatter(grad, DATA, scatter_dimension=spec.index(DATA), tiled=True) / n


def loss_and_grads(graphdef, loss_fn, mesh, strategy=STRATEGY, bind=bind):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)
    n = mesh.shape[DATA]

    def fn(shards, batch):  # shards: 1/n of each weight; batch: x f32[B/n, ...], my rows
        specs = state_specs(shards, strategy, mesh)  # from the global shapes, outside

        def local(shards, batch):
            params = jax.tree.map(gather, shards, specs)  # the all-gathers
            (_, metrics), grads = grad_fn(params, batch)  # the gradient of my rows
            grads = jax.tree.map(lambda g, s: scatter(g, s, n), grads, specs)  # reduce-scatters
            return jax.lax.pmean(metrics, DATA), grads  # the metrics' all-reduce

        return jax.shard_map(
            local, mesh=mesh, in_specs=(specs, BATCH), out_specs=(REPLICATED, specs)
        )(shards, batch)

    return jax.jit(fn)


def train_step(graphdef, loss_fn, tx, mesh, strategy=STRATEGY, bind=bind):
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, strategy, bind)

    def step(state: TrainState, batch):
        metrics, grads = grads_fn(state.params, batch)
        # Elementwise on the shards, outside shard_map; only --grad_clip's global norm needs a
        # collective here (a scalar all-reduce that XLA inserts).
        state = apply_gradients(state, grads, tx)
        return jax.lax.with_sharding_constraint(
            state, state_shardings(state, mesh, strategy)
        ), metrics

    return jax.jit(step, donate_argnums=0)


def eval_step(graphdef, eval_fn, mesh, strategy=STRATEGY, bind=bind):
    fn = bind(graphdef, eval_fn)

    def evaluate(shards, batch):
        specs = state_specs(shards, strategy, mesh)

        def local(shards, batch):
            return fn(jax.tree.map(gather, shards, specs), batch)  # the all-gathers

        return jax.shard_map(local, mesh=mesh, in_specs=(specs, BATCH), out_specs=BATCH)(
            shards, batch
        )

    return jax.jit(evaluate)
