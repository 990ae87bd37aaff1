"""Causal attention, two ways: `--attention=naive` or `--attention=fused`. Same shapes in and out:

    q: [B, T, H, D]   k, v: [B, S, K, D]   (K divides H: MHA K=H, GQA 1<K<H, MQA K=1)
    -> [B, T, H, D]

Query t sits at absolute position `offset + t` and sees keys at positions <= its own; with a KV
cache, S is the cache length and `valid` counts the keys written so far.
"""

import jax
import jax.numpy as jnp
from absl import logging


def causal_mask(t: int, s: int, offset=0, valid=None):
    """bool[T, S]: key j visible to query i iff j <= offset + i (and j < valid)."""
    q_pos = offset + jnp.arange(t)[:, None]
    k_pos = jnp.arange(s)[None, :]
    mask = k_pos <= q_pos
    return mask if valid is None else mask & (k_pos < valid)


def naive(q, k, v, offset=0, valid=None):
    """Materialises the [B, H, T, S] score matrix: the textbook formula, O(T*S) memory."""
    h, kv_heads = q.shape[2], k.shape[2]
    k = jnp.repeat(k, h // kv_heads, axis=2)  # GQA/MQA: each K/V head serves H/K query heads
    v = jnp.repeat(v, h // kv_heads, axis=2)
    scores = jnp.einsum('bthd,bshd->bhts', q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    mask = causal_mask(q.shape[1], k.shape[1], offset, valid)
    scores = jnp.where(mask, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)  # softmax in float32
    return jnp.einsum('bhts,bshd->bthd', weights, v)


def fused(q, k, v, offset=0, valid=None):
    """jax.nn.dot_product_attention: XLA's fused kernel on CPU, cuDNN flash attention on GPU."""
    impl = implementation(q.dtype)
    if offset == 0 and valid is None and q.shape[1] == k.shape[1]:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
    mask = causal_mask(q.shape[1], k.shape[1], offset, valid)[None, None]  # [1, 1, T, S]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=impl)


_warned = set()


def implementation(dtype) -> str | None:
    """'cudnn' where it runs (NVIDIA GPU, bf16/fp16), else XLA's, saying why once."""
    platform = jax.devices()[0].platform
    if platform == 'gpu' and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
        return 'cudnn'
    reason = f'{platform} platform' if platform != 'gpu' else f'{jnp.dtype(dtype).name} inputs'
    if reason not in _warned and platform == 'gpu':
        logging.warning('fused attention: cuDNN needs bf16/fp16 inputs; using XLA (%s)', reason)
    _warned.add(reason)
    return None


ATTENTION = {'naive': naive, 'fused': fused}
