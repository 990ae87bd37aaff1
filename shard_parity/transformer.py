"""A byte-level causal transformer in Flax NNX, laid out as nanoGPT's model.py.

Pre-norm blocks (LayerNorm -> causal self-attention -> residual; LayerNorm -> GELU MLP ->
residual), learned position embeddings, a final LayerNorm, and an output head tied to the byte
embedding. No biases and no dropout, as nanoGPT's shakespeare_char configuration; nanoGPT's init.
Like the MLP, it knows nothing of meshes.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from shard_parity.attention import ATTENTION
from shard_parity.config import TransformerConfig
from shard_parity.layers import LayerNorm, gelu
from shard_parity.matmul import dot_general, product
from shard_parity.models import linear

normal = nnx.initializers.normal


def dense(din, dout, cfg, rngs, std=0.02):
    return nnx.Linear(
        din,
        dout,
        use_bias=False,
        kernel_init=normal(std),
        dtype=cfg.compute_dtype,
        dot_general=dot_general,
        rngs=rngs,
    )


def per_head(init, kv_heads: int, head_dim: int):
    """`init`'s draw for the columns [k of every head | v of every head], stored per head as
    [k | v] (the layout __call__ reads): the same random values in the same roles as when this
    projection was laid out [k... | v...], so a given seed trains exactly as it did then."""

    def draw(key, shape, dtype=jnp.float32):
        w = init(key, shape, dtype).reshape(shape[0], 2, kv_heads, head_dim)
        return w.transpose(0, 2, 1, 3).reshape(shape)

    return draw


class CausalSelfAttention(nnx.Module):
    def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        hd = cfg.head_dim
        self.query = dense(cfg.embed_dim, cfg.num_heads * hd, cfg, rngs)
        self.key_value = nnx.Linear(
            cfg.embed_dim,
            2 * cfg.num_kv_heads * hd,
            use_bias=False,
            kernel_init=per_head(normal(0.02), cfg.num_kv_heads, hd),
            dtype=cfg.compute_dtype,
            dot_general=dot_general,
            rngs=rngs,
        )
        # nanoGPT scales the residual projections' init by 1/sqrt(2 * num_layers)
        self.out = dense(
            cfg.num_heads * hd, cfg.embed_dim, cfg, rngs, 0.02 / math.sqrt(2 * cfg.num_layers)
        )
        self.sum_partials = None  # set by explicit/tp.py (shard_parity/models.py says how)

    def __call__(self, x, cache=None, index=0):  # x: [B, T, C]
        b, t, _ = x.shape
        cfg = self.cfg
        # -1: all H heads, or under tensor parallelism this device's H/m (explicit/tp.py)
        q = self.query(x).reshape(b, t, -1, cfg.head_dim)  # [B, T, H, D]
        # Per head [k | v], as Megatron lays out its fused projection: a split of the columns
        # over devices falls between heads, and each device gets whole keys and values.
        k, v = jnp.split(self.key_value(x).reshape(b, t, -1, 2 * cfg.head_dim), 2, 3)
        if cache is None:  # training, or the padded generation path: the whole window at once
            y = ATTENTION[cfg.attention](q, k, v)
        else:  # write this chunk's keys and values at `index`, attend over everything written
            k = jax.lax.dynamic_update_slice(cache[0], k.astype(cache[0].dtype), (0, index, 0, 0))
            v = jax.lax.dynamic_update_slice(cache[1], v.astype(cache[1].dtype), (0, index, 0, 0))
            y = ATTENTION[cfg.attention](q, k, v, offset=index, valid=index + t)
            cache = (k, v)  # [B, S, K, D] each
        return linear(self.out, y.reshape(b, t, -1), self.sum_partials), cache


class FeedForward(nnx.Module):
    def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
        self.up = dense(cfg.embed_dim, 4 * cfg.embed_dim, cfg, rngs)
        self.down = dense(
            4 * cfg.embed_dim, cfg.embed_dim, cfg, rngs, 0.02 / math.sqrt(2 * cfg.num_layers)
        )
        self.sum_partials = None  # set by explicit/tp.py (shard_parity/models.py says how)

    def __call__(self, x):
        return linear(self.down, gelu(self.up(x)), self.sum_partials)


class Block(nnx.Module):
    def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
        self.norm1, self.attn = (
            LayerNorm(cfg.embed_dim, dtype=cfg.compute_dtype, rngs=rngs),
            CausalSelfAttention(cfg, rngs),
        )
        self.norm2, self.ffn = (
            LayerNorm(cfg.embed_dim, dtype=cfg.compute_dtype, rngs=rngs),
            FeedForward(cfg, rngs),
        )

    def __call__(self, x, cache=None, index=0):
        y, cache = self.attn(self.norm1(x), cache, index)
        x = x + y
        return x + self.ffn(self.norm2(x)), cache


class Transformer(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(
            cfg.vocab_size,
            cfg.embed_dim,
            embedding_init=normal(0.02),
            dtype=cfg.compute_dtype,
            rngs=rngs,
        )
        self.pos = nnx.Embed(
            cfg.seq_len,
            cfg.embed_dim,
            embedding_init=normal(0.02),
            dtype=cfg.compute_dtype,
            rngs=rngs,
        )
        self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
        self.norm = LayerNorm(cfg.embed_dim, dtype=cfg.compute_dtype, rngs=rngs)

    def __call__(self, tokens, caches=None, index=0):
        """tokens: i32[B, T] at positions index..index+T-1 -> (logits f32[B, T, 256], caches)."""
        t = tokens.shape[1]
        x = self.embed(tokens) + self.pos(index + jnp.arange(t))  # [B, T, C]
        new_caches = []
        for i, block in enumerate(self.blocks):
            x, cache = block(x, None if caches is None else caches[i], index)
            new_caches.append(cache)
        x = self.norm(x)
        table = self.embed.embedding[...].astype(x.dtype)
        logits = product(x, table, transposed=True)  # the head, tied to the embedding
        logits = logits.astype(jnp.float32)
        return logits, (None if caches is None else new_caches)

    def init_caches(self, batch: int):
        """Empty KV caches: per layer two [B, seq_len, K, D] arrays in the compute dtype, the
        keys' and values' own (cuDNN refuses a bf16 query beside float32 keys)."""
        shape = (batch, self.cfg.seq_len, self.cfg.num_kv_heads, self.cfg.head_dim)
        dtype = self.cfg.compute_dtype
        return [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in self.blocks]
