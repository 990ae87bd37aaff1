"""Context parallelism the compiler writes: we split each sequence, XLA works out attention.

On a DATA x SEQ mesh (`--mesh=4x2`: 4 groups of rows, each row's positions split 2 ways) the
tokens are placed `P('data', 'seq')` and the weights replicated (shard_parity/placement.py).
From that alone XLA's sharding propagation splits every activation the same way: the
embeddings, LayerNorms and feed-forward layers need nothing from other devices, and attention,
where each query needs every earlier key, gets whatever collectives the partitioner picks
(python -m parity_tests.collectives --strategy=cp shows them; on the CPU, all-gathers of the
keys and values over 'seq'). The model is called unchanged. Compare explicit/cp.py's ring.
"""

import jax
from jax.sharding import NamedSharding

from shard_parity.placement import BATCH, REPLICATED, SEQUENCE, state_shardings
from shard_parity.step import TrainState, apply_gradients, bind

STRATEGY = 'cp'  # --strategy=cp: each sequence split over 'seq', the rows over 'data'


def loss_and_grads(graphdef, loss_fn, mesh):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def fn(params, batch):  # params @ P(); batch: x[B, T] @ P('data', 'seq')
        batch = jax.lax.with_sharding_constraint(batch, NamedSharding(mesh, SEQUENCE))
        (_, metrics), grads = grad_fn(
            params, batch
        )  # XLA moves the keys and values attention needs
        # grads @ P(): each device saw only its rows' chunk, so XLA all-reduces over both axes.
        grads = jax.lax.with_sharding_constraint(grads, state_shardings(grads, mesh, STRATEGY))
        return jax.lax.with_sharding_constraint(metrics, NamedSharding(mesh, REPLICATED)), grads

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is the in_shardings


def train_step(graphdef, loss_fn, tx, mesh):
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh)

    def step(state: TrainState, batch):
        metrics, grads = grads_fn(state.params, batch)
        state = apply_gradients(state, grads, tx)  # replicated: the same update everywhere
        return jax.lax.with_sharding_constraint(
            state, state_shardings(state, mesh, STRATEGY)
        ), metrics

    return jax.jit(step, donate_argnums=0)


def eval_step(graphdef, eval_fn, mesh):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # per-sequence outputs come out split over 'data' only
        batch = jax.lax.with_sharding_constraint(batch, NamedSharding(mesh, SEQUENCE))
        return jax.lax.with_sharding_constraint(fn(params, batch), NamedSharding(mesh, BATCH))

    return jax.jit(evaluate)
