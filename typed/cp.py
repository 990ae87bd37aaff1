"""Context parallelism in JAX's Explicit mode: the types split each sequence, shard_map the ring.

On a DATA x SEQ mesh the tokens' type is `i32[B@data, T@seq]` after one `reshard`, and the
weights are whole on every device (`reduced` over both axes, a free cast, so their gradients
come out `unreduced` and one `reshard` adds them: the all-reduce, as typed/dp.py over 'data').
Everything but attention is per position, and the types carry the split through it with no
collective. Attention is not: Explicit mode has no type for "pass my block to the next device",
so the step drops to Manual mode there, `jax.shard_map` over the mesh around the ring only
(shard_parity/model/ring.py, with `pass_on` as in explicit/cp.py). The positions are put in the
layout's order first (zigzag by default: chunks i and 2n-1-i of 2n on device i), and the model
is called with them. Compare explicit/cp.py, where shard_map holds the whole step.
"""

import jax
from jax.sharding import NamedSharding

from shard_parity.mesh import SEQ
from shard_parity.model.ring import attention_on, order, reorder
from shard_parity.placement import BATCH, SEQUENCE, reduced_shardings, state_shardings
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'cp'  # --strategy=cp: each sequence split over 'seq', the rows over 'data'


def pass_on(blocks):  # (k, v, ...), f32[B/d, T/n, K, D] each: device i's go to device i + 1
    n = jax.lax.axis_size(SEQ)
    return jax.lax.ppermute(blocks, SEQ, [(i, (i + 1) % n) for i in range(n)])  # collective-permute


def ring(t, mesh, layout, spec=SEQUENCE):
    """The model call's keywords: the positions, i32[T] in the layout's order, and attention
    round the ring; q, k, v laid out `spec` (the composed step's: its rows, 'seq', 'model')."""
    per_device = jax.shard_map(  # Manual mode, for the ring only: q, k, v f32[B/d, T/n, ...]
        attention_on(SEQ, pass_on, layout), mesh=mesh, in_specs=spec, out_specs=spec
    )
    return {'positions': order(t, mesh.shape[SEQ], layout), 'attention': per_device}


def in_order(batch, mesh, layout):
    """batch x: i32[B@data, T], whole rows -> (x: i32[B@data, T@seq], each row's positions in
    the layout's order; the model call's keywords: those positions, i32[T], and attention)."""
    batch = jax.reshard(reorder(batch, mesh.shape[SEQ], layout), NamedSharding(mesh, SEQUENCE))
    return batch, ring(batch['x'].shape[1], mesh, layout)


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    def fn(params, batch):  # params: f32[in, out] (whole); batch: x i32[B@data, T]
        batch, call = in_order(batch, mesh, plan.layout)  # x: i32[B@data, T@seq]
        grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, **call), has_aux=True)
        # Free: reduced over both axes, so the gradients come out unreduced over both.
        params = jax.reshard(params, reduced_shardings(params, mesh, plan))
        # grads: f32[in, out]{U:(data, seq)}
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return metrics, jax.reshard(grads, state_shardings(grads, mesh, plan))  # all-reduce

    return jax.jit(fn)  # the inputs' placement (place_state, place_batch) is their type


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: the same on every device (replicated)
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    return make_train_step(grads_fn, tx, mesh, plan, place=jax.reshard)  # moves: reshard


def eval_step(graphdef, eval_fn, mesh, plan):
    def evaluate(params, batch):  # per-sequence outputs f32[B@data]: summed over 'seq'
        batch, call = in_order(batch, mesh, plan.layout)
        return jax.reshard(
            bind(graphdef, eval_fn, **call)(params, batch), NamedSharding(mesh, BATCH)
        )

    return jax.jit(evaluate)
