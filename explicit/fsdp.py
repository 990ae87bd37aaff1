"""FSDP (ZeRO-3) written by hand: every device keeps 1/n of each weight and of its optimizer
state, all-gathers a weight to use it, and reduce-scatters its gradient back to the shards.

Compare auto/fsdp.py. Inside shard_map, `all_gather` returns a value that varies per device,
so `grad` gives each device the gradient of its own rows (no implicit psum, no pcast needed);
`psum_scatter` then sums the n gradients and leaves each device the sum for its own shard.
"""

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import DATA, fsdp_spec
from shard_parity.step import TrainState, apply_gradients, bind

STRATEGY = 'fsdp'  # --strategy=fsdp
BATCH = P(DATA)  # split the leading (example) dimension across the 'data' axis
REPLICATED = P()  # no axis named: every device holds the whole array


def state_shardings(state, mesh):
    """The same placement as auto/fsdp.py."""
    return jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(x.shape, mesh.size)), state)


def place_state(state: TrainState, mesh) -> TrainState:
    return jax.device_put(state, state_shardings(state, mesh))


def place_batch(batch, mesh):
    sharding = NamedSharding(mesh, BATCH)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)


def gather(shard, spec):  # a weight's shard f32[d0/n, ...] -> the whole weight f32[d0, ...]
    return jax.lax.all_gather(shard, DATA, axis=0, tiled=True) if spec == BATCH else shard


def scatter(grad, spec, n):  # the local gradient of a whole weight -> the mean for my shard
    if spec == BATCH:
        return jax.lax.psum_scatter(grad, DATA, scatter_dimension=0, tiled=True) / n
    return jax.lax.pmean(grad, DATA)  # a small unsharded array (a bias of odd size): all-reduce


def loss_and_grads(graphdef, loss_fn, mesh):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)
    n = mesh.size

    def fn(shards, batch):  # shards: 1/n of each weight; batch: x f32[B/n, ...], my rows
        specs = jax.tree.map(lambda x: fsdp_spec(x.shape, n), shards)  # global shapes here

        def local(shards, batch):
            params = jax.tree.map(gather, shards, specs)  # the all-gathers
            params = jax.tree.map(  # unsharded leaves arrive invariant: cast as in DP
                lambda p, s: p if s == BATCH else jax.lax.pcast(p, DATA, to='varying'),
                params,
                specs,
            )
            (_, metrics), grads = grad_fn(params, batch)  # the gradient of my rows
            grads = jax.tree.map(lambda g, s: scatter(g, s, n), grads, specs)  # reduce-scatters
            return jax.lax.pmean(metrics, DATA), grads  # the metrics' all-reduce

        return jax.shard_map(
            local, mesh=mesh, in_specs=(specs, BATCH), out_specs=(REPLICATED, specs)
        )(shards, batch)

    return jax.jit(fn)


def train_step(graphdef, loss_fn, tx, mesh):
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh)

    def step(state: TrainState, batch):
        metrics, grads = grads_fn(state.params, batch)
        # Elementwise on the shards, outside shard_map; only --grad_clip's global norm needs a
        # collective here (a scalar all-reduce that XLA inserts).
        state = apply_gradients(state, grads, tx)
        return jax.lax.with_sharding_constraint(state, state_shardings(state, mesh)), metrics

    return jax.jit(step, donate_argnums=0)


def eval_step(graphdef, eval_fn, mesh):
    fn = bind(graphdef, eval_fn)
    n = mesh.size

    def evaluate(shards, batch):
        specs = jax.tree.map(lambda x: fsdp_spec(x.shape, n), shards)

        def local(shards, batch):
            return fn(jax.tree.map(gather, shards, specs), batch)  # the all-gathers

        return jax.shard_map(local, mesh=mesh, in_specs=(specs, BATCH), out_specs=BATCH)(
            shards, batch
        )

    return jax.jit(evaluate)
