"""Context parallelism written by hand: causal ring attention, each K/V pass a line of this file.

On a DATA x SEQ mesh each device holds B/d rows and, of each row, one chunk of T/n positions
(`P('data', 'seq')`, shard_parity/placement.py); the weights are whole on every device. All
but attention is per position and needs nothing from other devices. Attention runs round the
ring (shard_parity/model/attention.py's `ring`): each device attends to its own chunk's keys,
then passes its K/V block on to the next device and receives the previous one's, n - 1 times,
merging each block into an online softmax and skipping those that come after its queries.
`attention` below, and the chunk's first position, go into the model call. Compare auto/cp.py.
"""

import jax

from shard_parity.mesh import DATA, SEQ
from shard_parity.model.attention import ring
from shard_parity.placement import BATCH, REPLICATED, SEQUENCE
from shard_parity.step import bind, make_train_step

STRATEGY = 'cp'  # --strategy=cp: each sequence split over 'seq', the rows over 'data'


def pass_on(kv):  # kv: (k, v), f32[B/d, T/n, K, D] each: device i's block goes to device i + 1
    n = jax.lax.axis_size(SEQ)
    return jax.lax.ppermute(kv, SEQ, [(i, (i + 1) % n) for i in range(n)])  # collective-permute


def attention(q, k, v):  # q: [B/d, T/n, H, D]; k, v: [B/d, T/n, K, D], this device's chunk
    return ring(q, k, v, pass_on, jax.lax.axis_index(SEQ), jax.lax.axis_size(SEQ))


def chunk(graphdef, fn, batch):  # fn(params, batch) on this chunk, at its own positions
    first = jax.lax.axis_index(SEQ) * batch['x'].shape[1]  # x: i32[B/d, T/n]
    return bind(graphdef, fn, index=first, attention=attention)


def loss_and_grads(graphdef, loss_fn, mesh):
    def fn(params, batch):  # params: the full arrays; batch: x[B/d, T/n], my rows' chunk
        grad_fn = jax.value_and_grad(chunk(graphdef, loss_fn, batch), has_aux=True)
        # As in dp, but varying over both axes: every device's loss is a different term.
        params = jax.lax.pcast(params, (DATA, SEQ), to='varying')
        (_, metrics), grads = grad_fn(params, batch)  # the loss and gradient of my chunk
        return jax.lax.pmean((metrics, grads), (DATA, SEQ))  # the all-reduce over both axes

    return jax.jit(
        jax.shard_map(fn, mesh=mesh, in_specs=(REPLICATED, SEQUENCE), out_specs=REPLICATED)
    )


def train_step(graphdef, loss_fn, tx, mesh):
    # the gradients, then the shared update: the same on every device (replicated)
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh), tx, mesh, STRATEGY)


def eval_step(graphdef, eval_fn, mesh):
    def evaluate(params, batch):  # per-sequence means of my chunk, averaged over the chunks
        return jax.lax.pmean(chunk(graphdef, eval_fn, batch)(params, batch), SEQ)

    return jax.jit(
        jax.shard_map(evaluate, mesh=mesh, in_specs=(REPLICATED, SEQUENCE), out_specs=BATCH)
    )
