"""Context parallelism written by hand: causal ring attention, each K/V pass a line of this file.

On a DATA x SEQ mesh each device holds B/d rows and, of each row, T/n positions (`P('data',
'seq')`, shard_parity/placement.py); the weights are whole on every device. All but attention is
per position and needs nothing from other devices. Which positions a device holds is the
layout's: zigzag (default), chunks i and 2n-1-i of 2n, so that every device does the same work
at every pass of the ring; or contiguous. The step puts each row's positions in that order
(`reorder`, a local gather: the rows arrive whole, split over 'data' only), then shard_map splits
them. Attention runs round the ring (shard_parity/model/ring.py): each device attends to its
own keys, then passes its K/V block on to the next device and receives the previous one's,
n - 1 times, flash-attention style; the backward passes the blocks round again, with their
gradients. `attention` below and the positions go into the model call. Compare auto/cp.py.
"""

import jax

from shard_parity.mesh import DATA, SEQ
from shard_parity.model.ring import model_call, reorder
from shard_parity.placement import BATCH, REPLICATED, SEQUENCE
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'cp'  # --strategy=cp: each sequence split over 'seq', the rows over 'data'


def pass_on(blocks):  # (k, v, ...), f32[B/d, T/n, K, D] each: device i's go to device i + 1
    n = jax.lax.axis_size(SEQ)
    return jax.lax.ppermute(blocks, SEQ, [(i, (i + 1) % n) for i in range(n)])  # collective-permute


def chunk(graphdef, fn, batch, layout):  # fn(params, batch) on my part, at my positions
    # positions: i32[T/n]; attention(q [B/d, T/n, H, D], k, v [B/d, T/n, K, D]): the ring's
    return bind(graphdef, fn, **model_call(batch['x'].shape[1], SEQ, pass_on, layout))


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    def local(params, batch):  # params: the full arrays; batch: x[B/d, T/n], my rows' part
        grad_fn = jax.value_and_grad(chunk(graphdef, loss_fn, batch, plan.layout), has_aux=True)
        # As in dp, but varying over both axes: every device's loss is a different term.
        params = jax.lax.pcast(params, (DATA, SEQ), to='varying')
        # the loss and gradient of my part
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return jax.lax.pmean((metrics, grads), (DATA, SEQ))  # the all-reduce over both axes

    def fn(params, batch):  # params: the full arrays; batch: x[B, T] @ P('data'), rows whole
        # the layout's order first: a local gather, each device holding whole rows (P('data'))
        return jax.shard_map(
            local, mesh=mesh, in_specs=(REPLICATED, SEQUENCE), out_specs=REPLICATED
        )(params, reorder(batch, mesh.shape[SEQ], plan.layout))

    return jax.jit(fn)


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: the same on every device (replicated)
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    # per-sequence means of my part, averaged over the parts
    local = lambda p, b: jax.lax.pmean(chunk(graphdef, eval_fn, b, plan.layout)(p, b), SEQ)

    def evaluate(params, batch):  # the layout's order first; per-sequence outputs of my rows
        return jax.shard_map(local, mesh=mesh, in_specs=(REPLICATED, SEQUENCE), out_specs=BATCH)(
            params, reorder(batch, mesh.shape[SEQ], plan.layout)
        )

    return jax.jit(evaluate)
