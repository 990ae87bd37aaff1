"""Data parallelism the compiler writes: we only say where the arrays live.

The batch is split over the mesh's 'data' axis (`P('data')`) and the params are replicated
(`P()`). `jax.jit` sees that every device can only compute a partial gradient from its rows, and
inserts the all-reduce that sums them. There is no collective in this file; compare it line by
line with `explicit/train_step.py`, where the same all-reduce is written out.
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
    """Params and optimizer state @ P(): a full copy on every device."""
    return jax.device_put(state, NamedSharding(mesh, REPLICATED))


def place_batch(batch, mesh):
    """This process's rows of a batch -> global arrays split over the 'data' axis. With one
    process those rows are the whole batch; with several, each loads only its own part."""
    sharding = NamedSharding(mesh, BATCH)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)


def loss_and_grads(graphdef, loss_fn, mesh):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def fn(params, batch):  # params @ P(); batch: x f32[B, 784] @ P('data')
        (_, metrics), grads = grad_fn(params, batch)
        # grads @ P() and metrics @ P(): each device's rows give only a partial sum, so the
        # compiler inserts an all-reduce over 'data' here (see parity_tests/test_collectives.py).
        return metrics, grads

    return jax.jit(
        fn,
        in_shardings=(NamedSharding(mesh, REPLICATED), NamedSharding(mesh, BATCH)),
        out_shardings=NamedSharding(mesh, REPLICATED),
    )


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
    """Per-example outputs stay split like the batch: no collective at all."""
    fn = bind(graphdef, eval_fn)
    return jax.jit(
        fn,
        in_shardings=(NamedSharding(mesh, REPLICATED), NamedSharding(mesh, BATCH)),
        out_shardings=NamedSharding(mesh, BATCH),
    )
