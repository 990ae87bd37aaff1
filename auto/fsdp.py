"""FSDP (ZeRO-3) the compiler writes: parameters and optimizer state split over 'data' too.

The same step as auto/train_step.py; only the placement of the state changes: each array's
first dimension is split over the 'data' devices (shard_parity/placement.py). Before a layer
uses a weight, XLA all-gathers it; the gradient is reduce-scattered back to the shards, and each
device updates only its own shards. Compare explicit/fsdp.py, where both collectives are written
out. auto/tp.py and auto/fsdp_tp.py run these same functions with their own placement.
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
    """fsdp: each array split on its first dimension where the 'data' axis size divides it."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), state_specs(state, strategy, mesh))


def place_state(state: TrainState, mesh, strategy=STRATEGY) -> TrainState:
    return jax.device_put(state, state_shardings(state, mesh, strategy))


def place_batch(batch, mesh):
    """As in auto/train_step.py: this process's rows -> global arrays split over 'data'."""
    sharding = NamedSharding(mesh, BATCH)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)


def loss_and_grads(graphdef, loss_fn, mesh, strategy=STRATEGY):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def fn(params, batch):  # params @ state_specs (sharded); batch @ P('data')
        (_, metrics), grads = grad_fn(params, batch)
        # Sharded like the params: XLA all-gathers each weight where it is used and
        # reduce-scatters its gradient (see python -m parity_tests.collectives --strategy=fsdp).
        grads = jax.lax.with_sharding_constraint(grads, state_shardings(grads, mesh, strategy))
        return jax.lax.with_sharding_constraint(metrics, NamedSharding(mesh, REPLICATED)), grads

    return jax.jit(fn)  # the inputs' shardings (placed above) are the in_shardings


def train_step(graphdef, loss_fn, tx, mesh, strategy=STRATEGY):
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, strategy)

    def step(state: TrainState, batch):
        metrics, grads = grads_fn(state.params, batch)
        state = apply_gradients(state, grads, tx)  # elementwise: each device updates its shards
        return jax.lax.with_sharding_constraint(
            state, state_shardings(state, mesh, strategy)
        ), metrics

    return jax.jit(step, donate_argnums=0)


def eval_step(graphdef, eval_fn, mesh, strategy=STRATEGY):
    fn = bind(graphdef, eval_fn)
    return jax.jit(
        lambda params, batch: jax.lax.with_sharding_constraint(
            fn(params, batch), NamedSharding(mesh, BATCH)
        )
    )
