"""Context parallelism the compiler writes: we split each sequence, XLA works out attention.

On a DATA x SEQ mesh (`--mesh=4x2`: 4 groups of rows, each row's positions split 2 ways) the
tokens are placed `P('data', 'seq')` and the weights replicated (shard_parity/placement.py).
From that alone XLA's sharding propagation splits every activation the same way: the
embeddings, LayerNorms and feed-forward layers need nothing from other devices, and attention,
where each query needs every earlier key, gets whatever collectives the partitioner picks
(python -m inspector --strategy=cp shows them; on the CPU, all-gathers of the
keys and values over 'seq'). The model is called unchanged. Compare explicit/cp.py's ring.
"""

import jax
from jax.sharding import NamedSharding

from shard_parity.placement import BATCH, REPLICATED, SEQUENCE
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'cp'  # --strategy=cp: each sequence split over 'seq', the rows over 'data'


def loss_and_grads(graphdef, loss_fn, mesh, plan):  # plan.layout (--cp_layout) unused: XLA
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def fn(params, batch):  # params @ P(); batch: x[B, T] @ P('data', 'seq')
        batch = jax.lax.with_sharding_constraint(batch, NamedSharding(mesh, SEQUENCE))
        # XLA moves the keys and values that attention needs between the chunks' devices
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        # metrics and grads @ P(): each device saw only its rows' chunk, so XLA all-reduces
        # over both axes.
        return jax.lax.with_sharding_constraint((metrics, grads), NamedSharding(mesh, REPLICATED))

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is the in_shardings


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: the same on every device (replicated)
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):  # per-sequence outputs come out split over 'data' only
        batch = jax.lax.with_sharding_constraint(batch, NamedSharding(mesh, SEQUENCE))
        return jax.lax.with_sharding_constraint(fn(params, batch), NamedSharding(mesh, BATCH))

    return jax.jit(evaluate)
