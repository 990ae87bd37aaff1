"""Causal attention, two ways: `--attention=naive` or `--attention=fused`. Same shapes in and out:

    q: [B, T, H, D]   k, v: [B, S, K, D]   (K divides H: MHA K=H, GQA 1<K<H, MQA K=1)
    -> [B, T, H, D]

Query t sits at absolute position `offset + t` and sees keys at positions <= its own; with a KV
cache, S is the cache length and `valid` counts the keys written so far.
"""

import jax
import jax.numpy as jnp
from absl import logging

from shard_parity.model import splash
from shard_parity.model.ops import merge, split, vary_like, wide


def causal_mask(t: int, s: int, offset=0, valid=None):
    """bool[T, S]: key j visible to query i iff j <= offset + i (and j < valid)."""
    q_pos = offset + jnp.arange(t)[:, None]
    k_pos = jnp.arange(s)[None, :]
    mask = k_pos <= q_pos
    return mask if valid is None else mask & (k_pos < valid)


def naive(q, k, v, offset=0, valid=None):
    """Materialises the [B, H, T, S] score matrix: the textbook formula, O(T*S) memory."""
    h, kv_heads = q.shape[2], k.shape[2]
    k = _repeat(k, h // kv_heads)  # GQA/MQA: each K/V head serves H/K query heads
    v = _repeat(v, h // kv_heads)
    scores = jnp.einsum('bthd,bshd->bhts', q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    mask = causal_mask(q.shape[1], k.shape[1], offset, valid)
    f = wide(q.dtype)
    scores = jnp.where(mask, scores.astype(f), jnp.finfo(f).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)  # softmax in float32 (or 64)
    return jnp.einsum('bhts,bshd->bthd', weights, v)


def _repeat(x, groups: int):
    """[B, S, K, D] -> [B, S, K*groups, D], each head `groups` times in a row: jnp.repeat's own
    broadcast and reshape, the reshape `merge`, which in Explicit mode says the heads' sharding
    (under a pipeline's `vmap` jnp.repeat of heads split over 'model' asks for an out_sharding,
    jax 0.10.2)."""
    if groups == 1:
        return x
    b, s, k, d = x.shape
    return merge(jnp.broadcast_to(x[:, :, :, None], (b, s, k, groups, d)), 2, 2)


def fused(q, k, v, offset=0, valid=None):
    """A kernel where the platform has one: cuDNN's flash attention on an NVIDIA GPU (bf16/fp16),
    Pallas' splash attention on a TPU (shard_parity/model/splash.py: the training window);
    else `blockwise`, saying why once. Memory linear in the sequence length on every platform
    (benchmarks, section 3; docs/transformer.md, Attention)."""
    kind = implementation(q.dtype, splash.platform(q))
    if kind == 'cudnn':
        if _whole_window(offset, valid) and q.shape[1] == k.shape[1]:
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation='cudnn')
        mask = causal_mask(q.shape[1], k.shape[1], offset, valid)[None, None]  # [1, 1, T, S]
        return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation='cudnn')
    if kind == 'splash':
        reason = 'a KV cache' if not _whole_window(offset, valid) else splash.plan(q, k)[0]
        if reason is None:
            return splash.splash(q, k, v)
        _say(f'splash attention does not take {reason}', 'blockwise')
    return blockwise(q, k, v, offset, valid)


def _whole_window(offset, valid) -> bool:
    """No cache: queries and keys are the same positions from 0. Decided from Python values only:
    under jit the cache's `offset` is traced, and asking whether it is 0 would fail."""
    return valid is None and isinstance(offset, int) and offset == 0


KEY_BLOCK = 128  # keys per step of blockwise's loop: its scores are [B, H, T, KEY_BLOCK]


def blockwise(q, k, v, offset=0, valid=None):
    """FlashAttention's algorithm in plain JAX (Dao et al. 2022, with its v2 backward): a loop
    over blocks of KEY_BLOCK keys keeps a running max and sum of each query's softmax, so the
    T x S scores never exist at once, and the backward recomputes each block's probabilities
    from the saved log-sum-exp instead of storing them. jax.nn.dot_product_attention has no such
    path off the GPU: XLA's implementation materialises the scores, as `naive` does.

    The loop visits every key block for every query, masked blocks too, where a GPU kernel
    would skip those above the diagonal; and the backward computes the scores again. So it
    saves memory, not time: its time tracks naive's (benchmarks, section 3)."""
    if _whole_window(offset, valid):
        q, k, v = (_like(x, q, k, v) for x in (q, k, v))  # one type for the custom backward
        return _flash(q, k, v)
    return _blockwise_forward(q, k, v, offset, valid)[0]  # the KV cache: never differentiated


def _blocks(x, block):  # [B, S, K, D] -> [S/block, B, block, K, D], zero-padded
    pad = -x.shape[1] % block
    x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
    return split(x, 1, (-1, block)).swapaxes(0, 1)


def _block_scores(qs, kj, j, block, s, offset, valid):
    """Scaled, masked scores of every query against key block j: [B, K, G, T, block]."""
    scores = jnp.einsum('btkgd,bskd->bkgts', qs, kj)
    k_pos = j * block + jnp.arange(block)
    mask = causal_mask(qs.shape[1], block, offset - j * block, None) & (k_pos < s)
    if valid is not None:
        mask = mask & (k_pos < valid)
    return jnp.where(mask, scores, jnp.finfo(scores.dtype).min)


def _grouped(q, kv_heads):  # [B, T, H, D] -> float32 [B, T, K, H/K, D], scaled by 1/sqrt(D)
    b, t, h, d = q.shape  # (float64 for float64 inputs: the bisector's --x64, the x64 tests)
    return split(q.astype(wide(q.dtype)), 2, (kv_heads, h // kv_heads)) / jnp.sqrt(d)


def _operands(q, k, v):
    """(scaled grouped queries, key blocks, value blocks, block size) in float32 (float64 for
    float64 inputs), as both the forward and the backward loop over them."""
    block = min(KEY_BLOCK, k.shape[1])
    qs = _grouped(q, k.shape[2])
    f = qs.dtype
    return qs, _blocks(k.astype(f), block), _blocks(v.astype(f), block), block


def _blockwise_forward(q, k, v, offset=0, valid=None):
    """(output [B, T, H, D], log-sum-exp [B, K, G, T]) by the online softmax."""
    b, t, h, d = q.shape
    s = k.shape[1]
    qs, kb, vb, block = _operands(q, k, v)

    def step(carry, xs):
        kj, vj, j = xs
        return _online_softmax(carry, _block_scores(qs, kj, j, block, s, offset, valid), vj), None

    (top, total, acc), _ = jax.lax.scan(
        step, _softmax_start(qs, kb), (kb, vb, jnp.arange(kb.shape[0]))
    )
    out = acc / jnp.moveaxis(total, 3, 1)[..., None]
    return merge(out, 2, 2).astype(q.dtype), top + jnp.log(total)


def _softmax_start(qs, *refs):
    """The online softmax before any key: running max -inf (float32's lowest), sum 0, values 0."""
    zero = _like(jnp.zeros_like(qs[..., 0]), qs, *refs)  # [B, T, K, G], split as qs is
    stats = jnp.moveaxis(zero, 1, 3)  # [B, K, G, T]
    return stats + jnp.finfo(qs.dtype).min, stats, _like(jnp.zeros_like(qs), *refs)


def _online_softmax(carry, scores, vj):
    """One block of keys merged into each query's running max, sum and weighted values: the
    earlier blocks' sum and values are rescaled by exp(old max - new max)."""
    top, total, acc = carry  # [B, K, G, T], [B, K, G, T], [B, T, K, G, D]
    new_top = jnp.maximum(top, scores.max(-1))
    p = jnp.exp(scores - new_top[..., None])
    rescale = jnp.exp(top - new_top)
    total = total * rescale + p.sum(-1)
    acc = acc * jnp.moveaxis(rescale, 3, 1)[..., None] + jnp.einsum('bkgts,bskd->btkgd', p, vj)
    return new_top, total, acc


@jax.custom_vjp
def _flash(q, k, v):
    return _blockwise_forward(q, k, v)[0]


def _flash_fwd(q, k, v):
    out, lse = _blockwise_forward(q, k, v)
    return out, (q, k, v, out, lse)


def _flash_bwd(saved, g):
    q, k, v, out, lse = saved
    b, t, h, d = q.shape
    s = k.shape[1]
    qs, kb, vb, block = _operands(q, k, v)
    g = split(g.astype(qs.dtype), 2, qs.shape[2:4])
    # d(softmax) needs each query's sum_j p_j dp_j, which is its row of g . out
    delta = jnp.moveaxis((g * split(out.astype(qs.dtype), 2, qs.shape[2:4])).sum(-1), 1, 3)

    def step(dq, xs):
        kj, vj, j = xs
        p = jnp.exp(_block_scores(qs, kj, j, block, s, 0, None) - lse[..., None])
        dv = jnp.einsum('bkgts,btkgd->bskd', p, g)
        ds = p * (jnp.einsum('btkgd,bskd->bkgts', g, vj) - delta[..., None])
        dq = dq + jnp.einsum('bkgts,bskd->btkgd', ds, kj)
        dk = jnp.einsum('bkgts,btkgd->bskd', ds, qs)
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(
        step, _like(jnp.zeros_like(qs), kb, g), (kb, vb, jnp.arange(kb.shape[0]))
    )

    def unblock(x):  # [S/block, B, block, K, D] -> [B, S, K, D]
        return merge(x.swapaxes(0, 1), 1, 2)[:, :s]

    dq = merge(dq / jnp.sqrt(d), 2, 2)
    return dq.astype(q.dtype), unblock(dk).astype(k.dtype), unblock(dv).astype(v.dtype)


_flash.defvjp(_flash_fwd, _flash_bwd)


def _like(x, *refs):
    """x, varying over every mesh axis any of `refs` varies over (inside shard_map), as a
    scan's initial carry must be to match what the loop body makes of them."""
    for ref in refs:
        x = vary_like(x, ref)
    return x


_warned = set()


def _say(why: str, path: str):
    """One line, once per reason: which path --attention=fused took instead of a kernel."""
    if why not in _warned:
        _warned.add(why)
        logging.warning('--attention=fused: %s; %s attention instead', why, path)


def implementation(dtype, platform: str | None = None) -> str | None:
    """'cudnn' on an NVIDIA GPU with bf16/fp16 inputs, 'splash' on a TPU (or under
    SHARD_PARITY_SPLASH=interpret: splash.py), else None (blockwise), saying why once.
    `platform`: where the program runs (its mesh's, a --target's when compiled ahead of time;
    by default this process's devices'). cuDNN is chosen on this process's GPUs only."""
    here = jax.devices()[0].platform
    platform = platform or here
    if here == 'gpu' and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
        return 'cudnn'
    if splash.available(platform):
        return 'splash'
    if platform == 'gpu':
        _say(f'cuDNN needs bf16/fp16 inputs, not {jnp.dtype(dtype).name}', 'blockwise')
    else:
        _say(f'no attention kernel on the {platform} platform', 'blockwise')
    return None


ATTENTION = {'naive': naive, 'fused': fused}
