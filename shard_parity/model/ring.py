"""Causal ring attention with flash attention's memory: context parallelism's attention.

A sequence of T positions is split over the n devices of a ring, C = T/n positions each. Which
positions a device holds is the layout's (`order`): `contiguous`, device i holds i·C ... (i+1)·C
- 1; `zigzag` (the default), device i holds chunk i and chunk 2n-1-i of 2n chunks of c = T/2n,
so every device has as many early positions as late ones. Here is T = 16, n = 4:

    positions   0 1 | 2 3 | 4 5 | 6 7 | 8 9 | 10 11 | 12 13 | 14 15
    chunk       0     1     2     3     4     5       6       7
    zigzag      d0    d1    d2    d3    d3    d2      d1      d0
    contiguous  d0    d0    d1    d1    d2    d2      d3      d3

Each device sends the K/V block it holds to the next device n - 1 times (`pass_on`, in a
fori_loop: one collective-permute per array in its body), and attends to each block as it comes:
after s passes device i holds block (i - s) mod n, whose positions are row (i - s) mod n of
`table` (i32[n, C], `order` by device). Queries and keys are compared by those positions, so
nothing assumes a device's positions contiguous. Of another device's block, only what my queries
see is computed (`_Ring.visit`, a `jax.lax.cond`): an earlier device's first chunk against all my
queries, or a later device's whole block against my last chunk (zigzag); so in the zigzag layout
every device computes two chunk pairs at every pass, where contiguous devices compute 1 or 0.

Memory, as `attention.blockwise`: within a pair, a scan over KEY_BLOCK keys folds each block into
an online softmax, so at most [B, H, c, KEY_BLOCK] scores exist at once; and the custom VJP saves
q, k, v, the output and the log-sum-exp only (nothing T x T). The backward runs the ring again:
each block's probabilities are recomputed from the log-sum-exp, and the gradients of a block's
keys and values travel round the ring with the block, collecting every device's share, and are
passed once more at the end to arrive home (Liu et al. 2023; ring-flash-attention's scheme).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from shard_parity.model import attention as A

LAYOUTS = {'zigzag': 2, 'contiguous': 1}  # layout -> how many chunks each device holds
NEVER = np.iinfo(np.int32).max  # the position of padding keys: after every query


def order(t: int, n: int, layout: str) -> np.ndarray:
    """i32[T]: the positions in the order the n devices hold them (device i: the i-th T/n)."""
    chunks = np.arange(t, dtype=np.int32).reshape(n * LAYOUTS[layout], -1)
    if layout == 'zigzag':
        chunks = [chunks[j] for i in range(n) for j in (i, 2 * n - 1 - i)]
    return np.concatenate(list(chunks))


def reorder(batch, n: int, layout: str):
    """Each row's positions into `order` (leaves [B, T], whole rows: a local gather), so that
    splitting the rows into n equal parts gives each device its positions."""
    return jax.tree.map(lambda a: a[:, order(a.shape[1], n, layout)], batch)


def _table(c: int, axis: str, layout: str) -> np.ndarray:  # i32[n, c]: each device's positions
    n = jax.lax.axis_size(axis)
    return order(c * n, n, layout).reshape(n, c)


def attention_on(axis: str, pass_on, layout: str):
    """Inside shard_map over `axis`: attention(q, k, v) round the ring of `axis`, each device's
    q, k, v at its positions in `layout`, blocks sent on with `pass_on`."""

    def attention(q, k, v):  # q: [B, c, H, D]; k, v: [B, c, K, D]
        me = jax.lax.axis_index(axis)
        return ring_attention(q, k, v, _table(q.shape[1], axis, layout), me, pass_on, layout)

    return attention


def model_call(c: int, axis: str, pass_on, layout: str) -> dict:
    """Inside shard_map over `axis`, c positions per device: the model call's keywords, this
    device's positions (i32[c]) and the ring's attention."""
    positions = jnp.asarray(_table(c, axis, layout))[jax.lax.axis_index(axis)]
    return {'positions': positions, 'attention': attention_on(axis, pass_on, layout)}


def visible(q_pos, k_pos):  # bool[c, s]: key s visible to query t iff it is not after it
    return k_pos[None, :] <= q_pos[:, None]


def ring_attention(q, k, v, table, me, pass_on, layout):
    """q: [B, C, H, D], k, v: [B, C, K, D], this device's (`me`'s) positions -> [B, C, H, D].
    `table`: i32[n, C], each device's positions; `pass_on(tree)` sends a tree of blocks to the
    next device of the ring and returns the previous one's."""
    ring = functools.partial(_Ring, np.asarray(table), pass_on=pass_on, parts=LAYOUTS[layout])

    @jax.custom_vjp
    def attend(q, k, v, me):  # `me` an argument, not a closure: the backward is traced apart
        return ring(me).forward(q, k, v)[0]

    def forward(q, k, v, me):
        out, lse = ring(me).forward(q, k, v)
        return out, (q, k, v, out, lse, me)  # residuals: nothing with two sequence dimensions

    def backward(saved, g):
        *saved, me = saved
        return (*ring(me).backward(*saved, g), None)  # None: `me` is an integer

    attend.defvjp(forward, backward)
    return attend(q, k, v, me)


def _keys(x, s):  # [B, s, K, D] -> f32[s/block, B, block, K, D] (f64 for f64), zero-padded
    return A._blocks(x.astype(A.wide(x.dtype)), min(A.KEY_BLOCK, s))


def _key_positions(pos):  # [s] -> [s/block, block], padded with NEVER
    block = min(A.KEY_BLOCK, pos.shape[0])
    pos = jnp.pad(pos, (0, -pos.shape[0] % block), constant_values=NEVER)
    return pos.reshape(-1, block)


def _at(x, part, axis):  # x's positions `part` (a slice) along `axis`
    return x[(slice(None),) * axis + (part,)]


def _put(x, part, axis, y):
    return y if part == slice(None) else x.at[(slice(None),) * axis + (part,)].set(y)


class _Ring:
    """The ring's passes, forward and backward, for one device (`me`) of it."""

    def __init__(self, table, me, pass_on, parts):
        self.table, self.me, self.pass_on, self.n = jnp.asarray(table), me, pass_on, len(table)
        c = table.shape[1] // parts  # a chunk: half of my positions (zigzag), or all of them
        self.first, self.last = slice(0, c), slice(table.shape[1] - c, None)
        self.parts = parts

    def own(self, fold, acc, block):
        """`acc` with my own block folded in: the diagonal, under the causal mask."""
        q_pos, every = self.table[self.me], slice(None)
        return fold(acc, every, every, q_pos, q_pos, block)

    def visit(self, s, fold, acc, block):
        """`acc` with the block held after s > 0 passes folded in, as far as my queries see it:
        an earlier device's block, whose first chunk all my queries see, or a later one's,
        which only my last chunk sees (zigzag), whole. The rest of it is skipped."""
        q_pos, k_pos = self.table[self.me], self.table[(self.me - s) % self.n]
        every = slice(None)

        def early(acc, block):
            return fold(acc, every, self.first, q_pos, k_pos, block)

        def late(acc, block):
            return fold(acc, self.last, every, q_pos, k_pos, block) if self.parts > 1 else acc

        return jax.lax.cond(k_pos[0] < q_pos[0], early, late, acc, block)

    def forward(self, q, k, v):
        qs = A._grouped(q, k.shape[2])  # [B, C, K, G, D], float32, scaled

        def fold(stats, qp, kp, q_pos, k_pos, kv):
            top, total, acc = stats  # [B, K, G, C], [B, K, G, C], [B, C, K, G, D]
            mine = (_at(top, qp, 3), _at(total, qp, 3), _at(acc, qp, 1))
            keys = (_at(kv[0], kp, 1), _at(kv[1], kp, 1), k_pos[kp])
            top_, total_, acc_ = _fold(mine, _at(qs, qp, 1), q_pos[qp], *keys)
            return _put(top, qp, 3, top_), _put(total, qp, 3, total_), _put(acc, qp, 1, acc_)

        def one_pass(s, carry):  # the block of s passes ago: one collective-permute per array
            stats, kv = carry
            kv = self.pass_on(kv)
            return self.visit(s, fold, stats, kv), kv

        stats = self.own(fold, A._softmax_start(qs, k, v), (k, v))
        top, total, acc = jax.lax.fori_loop(1, self.n, one_pass, (stats, (k, v)))[0]
        out = acc / jnp.moveaxis(total, 3, 1)[..., None]
        return out.reshape(q.shape).astype(q.dtype), top + jnp.log(total)  # lse: [B, K, G, C]

    def backward(self, q, k, v, out, lse, g):
        qs = A._grouped(q, k.shape[2])
        g = g.astype(qs.dtype).reshape(qs.shape)
        # d(softmax) needs each query's sum_j p_j dp_j, which is its row of g . out
        delta = jnp.moveaxis((g * out.astype(qs.dtype).reshape(qs.shape)).sum(-1), 1, 3)

        def fold(acc, qp, kp, q_pos, k_pos, block):
            dq, dk, dv = acc
            mine = (_at(qs, qp, 1), _at(g, qp, 1), _at(lse, qp, 3), _at(delta, qp, 3), q_pos[qp])
            keys = (_at(block[0], kp, 1), _at(block[1], kp, 1), k_pos[kp])
            grads = (_at(dq, qp, 1), _at(dk, kp, 1), _at(dv, kp, 1))
            dq_, dk_, dv_ = _fold_grads(grads, *mine, *keys)
            return _put(dq, qp, 1, dq_), _put(dk, kp, 1, dk_), _put(dv, kp, 1, dv_)

        dq = A._like(jnp.zeros_like(qs), k, g)
        zero = A._like(jnp.zeros(k.shape, qs.dtype), q, k, g)

        def one_pass(s, carry):  # a K/V block and its gradients so far travel together
            dq, block = carry
            block = self.pass_on(block)
            dq, dk, dv = self.visit(s, fold, (dq, *block[2:]), block)
            return dq, (*block[:2], dk, dv)

        dq, dk, dv = self.own(fold, (dq, zero, zero), (k, v))
        dq, block = jax.lax.fori_loop(1, self.n, one_pass, (dq, (k, v, dk, dv)))
        dk, dv = self.pass_on(block[2:])  # the n-th pass: each block's gradients reach home
        dq = (dq / jnp.sqrt(q.shape[3])).reshape(q.shape)
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


def _fold(stats, qs, q_pos, k, v, k_pos):
    """Key chunk (k, v) at positions k_pos, block by block, into the queries' online softmax."""

    def step(stats, xs):
        kj, vj, pj = xs
        scores = jnp.einsum('btkgd,bskd->bkgts', qs, kj)  # [B, K, G, c, block]
        scores = jnp.where(visible(q_pos, pj), scores, jnp.finfo(scores.dtype).min)
        return A._online_softmax(stats, scores, vj), None

    s = k.shape[1]
    return jax.lax.scan(step, stats, (_keys(k, s), _keys(v, s), _key_positions(k_pos)))[0]


def _fold_grads(acc, qs, g, lse, delta, q_pos, k, v, k_pos):
    """(dq, dk, dv) of one query chunk against one key chunk, added to `acc`: flash
    attention's backward, each block's probabilities recomputed from the log-sum-exp."""

    def step(dq, xs):
        kj, vj, pj = xs
        scores = jnp.einsum('btkgd,bskd->bkgts', qs, kj)
        p = jnp.where(visible(q_pos, pj), jnp.exp(scores - lse[..., None]), 0.0)
        dv = jnp.einsum('bkgts,btkgd->bskd', p, g)
        ds = p * (jnp.einsum('btkgd,bskd->bkgts', g, vj) - delta[..., None])
        return dq + jnp.einsum('bkgts,bskd->btkgd', ds, kj), (
            jnp.einsum('bkgts,btkgd->bskd', ds, qs),
            dv,
        )

    dq, dk, dv = acc
    s = k.shape[1]
    dq, (dkb, dvb) = jax.lax.scan(step, dq, (_keys(k, s), _keys(v, s), _key_positions(k_pos)))

    def unblock(x):  # [s/block, B, block, K, D] -> [B, s, K, D]
        return x.swapaxes(0, 1).reshape(dk.shape[0], -1, *dk.shape[2:])[:, :s]

    return dq, dk + unblock(dkb), dv + unblock(dvb)
