"""Data parallelism written by hand: every collective is a line of this file.

`jax.shard_map` runs the function once per device on that device's shard: the batch arrives as
B/n rows (`P('data')`), the params whole (`P()`). Each device computes the loss and gradient of
its own rows, and one `jax.lax.pmean` over 'data' averages them: the all-reduce that the
compiler inserts by itself in `auto/train_step.py`.
"""

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import DATA
from shard_parity.step import TrainState, apply_gradients, bind

STRATEGY = 'dp'  # --strategy=dp
BATCH = P(DATA)  # split the leading (example) dimension across the 'data' axis
REPLICATED = P()  # no axis named: every device holds the whole array


def state_shardings(state, mesh):
    """Data parallelism keeps the whole state on every device."""
    return jax.tree.map(lambda _: NamedSharding(mesh, REPLICATED), state)


def place_state(state: TrainState, mesh) -> TrainState:
    """The same placement as auto/: shard_map's in_specs match it, so no copy before each step."""
    return jax.device_put(state, NamedSharding(mesh, REPLICATED))


def place_batch(batch, mesh):
    """This process's rows of a batch -> global arrays split over the 'data' axis. With one
    process those rows are the whole batch; with several, each loads only its own part."""
    sharding = NamedSharding(mesh, BATCH)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)


def loss_and_grads(graphdef, loss_fn, mesh):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def fn(params, batch):  # params: the full arrays; batch: x f32[B/n, 784], this device's rows
        # Mark the params as varying per device first. Left invariant, `grad` would transpose their
        # implicit broadcast into a psum, and the pmean below would return the sum, n times too big.
        params = jax.lax.pcast(params, DATA, to='varying')
        (_, metrics), grads = grad_fn(params, batch)  # the loss and gradient of the local rows
        return jax.lax.pmean((metrics, grads), DATA)  # the all-reduce: average over the 'data' axis

    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(REPLICATED, BATCH), out_specs=REPLICATED))


def train_step(graphdef, loss_fn, tx, mesh):
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh)
    replicated, batch = NamedSharding(mesh, REPLICATED), NamedSharding(mesh, BATCH)

    def step(state: TrainState, batch_):
        metrics, grads = grads_fn(state.params, batch_)
        return apply_gradients(state, grads, tx), metrics  # replicated: same update everywhere

    return jax.jit(
        step, in_shardings=(replicated, batch), out_shardings=replicated, donate_argnums=0
    )


def eval_step(graphdef, eval_fn, mesh):
    """Per-example outputs of the local rows, concatenated back along 'data': no collective."""
    return jax.jit(
        jax.shard_map(
            bind(graphdef, eval_fn), mesh=mesh, in_specs=(REPLICATED, BATCH), out_specs=BATCH
        )
    )
