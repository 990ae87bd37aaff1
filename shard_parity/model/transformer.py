"""A byte-level causal transformer in Flax NNX, laid out as nanoGPT's model.py.

Pre-norm blocks (LayerNorm -> causal self-attention -> residual; LayerNorm -> GELU MLP ->
residual), learned position embeddings, a final LayerNorm, and an output head tied to the byte
embedding. No biases and no dropout, as nanoGPT's shakespeare_char configuration; nanoGPT's init.
Like the MLP, it knows nothing of meshes.

The blocks are stored stacked: one Block whose every parameter has a leading [L] layer dimension
(`blocks.attn.query.kernel`: f32[L, C, C]), initialised block by block exactly as a list of L
blocks would be, so a given seed gives the same values. Layer i is a static slice of them
(`layers()`). A strategy that passes `layer_weights=` (FSDP's per-layer all-gather) gets the
blocks run under one `lax.scan` instead, each layer under `jax.checkpoint`: one layer's weights
are live at a time, and the backward calls `layer_weights` again rather than keep its output.

--remat_policy (`TransformerConfig.remat_policy`, docs/remat.md): full, dots and dots_no_batch
run the blocks under that scan (in a pipeline, each stage's) with every layer under
`jax.checkpoint` with that jax.checkpoint_policies policy: in a scan the backward's loop
recomputes what the policy did not save (on each unrolled layer the checkpoint left XLA:CPU's
temp memory unchanged, to the byte); none takes no checkpoint on the path the strategy runs
anyway (unrolled; FSDP's and the pipelines' scans). Unset, each path keeps what it did before
the flag: FSDP's scan `full`, every other path `none`.
"""

import dataclasses
import functools
import math
import jax
import jax.numpy as jnp
from flax import nnx

from shard_parity import UsageError
from shard_parity.model.attention import ATTENTION
from shard_parity.model.mlp import linear
from shard_parity.model.moe import MoE, check_experts
from shard_parity.model.ops import (
    Dot,
    LayerNorm,
    gelu,
    lookup,
    merge,
    product,
    split,
    typed,
    wide,
)

normal = nnx.initializers.normal

# --remat_policy -> the jax.checkpoint_policies policy each block runs under: what the forward
# keeps for the backward (the rest is recomputed there). 'none': no jax.checkpoint at all.
REMAT_POLICIES = {
    'none': None,  # every intermediate the backward reads is kept
    'full': 'nothing_saveable',  # only each block's input: the backward reruns the block
    'dots': 'dots_saveable',  # every dot's output (projections, attention scores and mix)
    'dots_no_batch': 'dots_with_no_batch_dims_saveable',  # the dots without batch dimensions:
    # the weight matmuls' outputs, not attention's batched (per-head) scores and mix
}
REMAT = ('full', 'dots', 'dots_no_batch')  # the policies that checkpoint: they run in the scan


def remat(body, policy: str):
    """`body` under jax.checkpoint with `policy`'s (REMAT_POLICIES) policy; as it is for 'none'.
    The dots policies save no `unreduced` product (typed/'s row-parallel partial sums, before
    the sum over 'model'): jax 0.10.2 has no rule to slice one back out of the scan's stack of
    saved values (NotImplementedError: unreduced rule for dynamic_slice), so it is recomputed."""
    name = REMAT_POLICIES[policy]
    if name is None:
        return body
    saves = getattr(jax.checkpoint_policies, name)
    if name != 'nothing_saveable':
        saves = functools.partial(reduced_only, saves)
    return jax.checkpoint(body, policy=saves)


def reduced_only(policy, prim, *avals, **params) -> bool:
    """`policy`'s answer for a primitive whose output is not `unreduced`; False for one that is."""
    spec = getattr(params.get('out_sharding'), 'spec', None)
    return not getattr(spec, 'unreduced', None) and policy(prim, *avals, **params)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A byte-level causal transformer. Defaults: nanoGPT's shakespeare_char CPU configuration."""

    vocab_size: int = 256
    seq_len: int = 64  # the context: position embeddings exist for this many bytes
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4  # = num_heads: MHA; a divisor: GQA; 1: MQA
    embed_dim: int = 128
    attention: str = 'naive'  # 'naive' or 'fused' (shard_parity/model/attention.py)
    dtype: str = 'float32'  # compute dtype; parameters stay float32
    # each weight gradient's dtype as its dot forms it (--reduce_dtype: what auto/ and typed/
    # then all-reduce; explicit/ casts to it beside each collective): docs/numerics.md
    reduce_dtype: str = 'float32'
    # Mixture of experts (shard_parity/model/moe.py): 0 experts is the dense feed-forward.
    num_experts: int = 0
    experts_per_token: int = 1  # K: each token's top-K experts
    capacity_factor: float = 1.25  # each expert's slots per sequence: ceil(factor * T * K / E)
    # what each block keeps for the backward (REMAT_POLICIES); None: as before the field was,
    # `full` under FSDP's scan, `none` elsewhere (a config.json without it reads as None)
    remat_policy: str | None = None

    def __post_init__(self):
        for name in ('seq_len', 'num_layers', 'num_heads', 'num_kv_heads', 'embed_dim'):
            if getattr(self, name) < 1:
                raise UsageError(f'--{name}={getattr(self, name)} must be at least 1')
        if self.num_heads % self.num_kv_heads:
            raise UsageError(
                f'--num_kv_heads={self.num_kv_heads} does not divide --num_heads='
                f'{self.num_heads}: each key/value head serves a whole group of query heads'
            )
        if self.embed_dim % self.num_heads:
            raise UsageError(
                f'--embed_dim={self.embed_dim} is not divisible by --num_heads={self.num_heads}'
            )

        if self.remat_policy is not None and self.remat_policy not in REMAT_POLICIES:
            raise UsageError(
                f'--remat_policy={self.remat_policy} is not one of {", ".join(REMAT_POLICIES)}'
            )
        check_experts(self)

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)


def dense(din, dout, cfg, rngs, std=0.02):
    return nnx.Linear(
        din,
        dout,
        use_bias=False,
        kernel_init=normal(std),
        dtype=cfg.compute_dtype,
        dot_general=Dot(cfg.reduce_dtype),
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
            dot_general=Dot(cfg.reduce_dtype),
            rngs=rngs,
        )
        # nanoGPT scales the residual projections' init by 1/sqrt(2 * num_layers)
        self.out = dense(
            cfg.num_heads * hd, cfg.embed_dim, cfg, rngs, 0.02 / math.sqrt(2 * cfg.num_layers)
        )

    def __call__(self, x, cache=None, index=0, sum_partials=None, attention=None):  # x: [B, T, C]
        b, t, _ = x.shape
        cfg = self.cfg
        # -1: all H heads, or under explicit tensor parallelism this device's H/m
        q = split(self.query(x), 2, (-1, cfg.head_dim))  # [B, T, H, D]
        # Per head [k | v], as Megatron lays out its fused projection: a split of the columns
        # over devices falls between heads, and each device gets whole keys and values.
        k, v = jnp.split(split(self.key_value(x), 2, (-1, 2 * cfg.head_dim)), 2, 3)
        if cache is None:  # training, or the padded generation path: the whole window at once
            y = (attention or ATTENTION[cfg.attention])(q, k, v)
        else:  # write this chunk's keys and values at `index`, attend over everything written
            k = jax.lax.dynamic_update_slice(cache[0], k.astype(cache[0].dtype), (0, index, 0, 0))
            v = jax.lax.dynamic_update_slice(cache[1], v.astype(cache[1].dtype), (0, index, 0, 0))
            y = ATTENTION[cfg.attention](q, k, v, offset=index, valid=index + t)
            cache = (k, v)  # [B, S, K, D] each
        return linear(self.out, merge(y, 2, 2), sum_partials), cache


class FeedForward(nnx.Module):
    def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
        self.up = dense(cfg.embed_dim, 4 * cfg.embed_dim, cfg, rngs)
        self.down = dense(
            4 * cfg.embed_dim, cfg.embed_dim, cfg, rngs, 0.02 / math.sqrt(2 * cfg.num_layers)
        )

    def __call__(self, x, sum_partials=None):
        return linear(self.down, gelu(self.up(x)), sum_partials)


class Block(nnx.Module):
    def __init__(self, cfg: TransformerConfig, rngs: nnx.Rngs):
        self.norm1, self.attn = (
            LayerNorm(cfg.embed_dim, dtype=cfg.compute_dtype, rngs=rngs),
            CausalSelfAttention(cfg, rngs),
        )
        self.norm2, self.ffn = (
            LayerNorm(cfg.embed_dim, dtype=cfg.compute_dtype, rngs=rngs),
            MoE(cfg, rngs) if cfg.num_experts else FeedForward(cfg, rngs),
        )

    def __call__(
        self, x, cache=None, index=0, sum_partials=None, attention=None, experts=None, stats=None
    ):
        y, cache = self.attn(self.norm1(x), cache, index, sum_partials, attention)
        x = x + y
        if isinstance(self.ffn, MoE):  # `experts`: expert parallelism's hook; stats: the loss's
            return x + self.ffn(self.norm2(x), experts, stats, sum_partials), cache
        return x + self.ffn(self.norm2(x), sum_partials), cache


def stack(blocks: list[Block]) -> Block:
    """One Block whose params are `blocks`' params stacked on a new leading [L] dimension."""
    graphdef, states = nnx.split(blocks[0])[0], [nnx.split(b)[1] for b in blocks]
    return nnx.merge(graphdef, jax.tree.map(lambda *w: jnp.stack(w), *states))


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
        self.blocks = stack([Block(cfg, rngs) for _ in range(cfg.num_layers)])  # params [L, ...]
        self.norm = LayerNorm(cfg.embed_dim, dtype=cfg.compute_dtype, rngs=rngs)

    def __call__(
        self,
        tokens,
        caches=None,
        index=0,
        sum_partials=None,
        attention=None,
        positions=None,
        layer_weights=None,
        experts=None,
        moe_stats=None,
        pipeline=None,
    ):
        """tokens: i32[B, T] at positions index..index+T-1 -> (logits f32[B, T, 256], caches).
        `sum_partials`: explicit tensor parallelism's psum over 'model' (explicit/tp.py), which
        adds the partial sums of each row-parallel layer (attention `out`, feed-forward `down`).
        `attention`: `(q, k, v) -> y` in place of cfg.attention's, without a cache: explicit
        context parallelism's ring (explicit/cp.py), where `tokens` are this device's part of
        each sequence and `positions`, i32[T], their positions (not contiguous in cp's zigzag
        layout: shard_parity/model/ring.py), may be traced values.
        `layer_weights`: one layer's params as stored -> as the layer uses them, called where
        the layer runs (FSDP's per-layer all-gather, explicit/fsdp.py); the layers then run
        under a scan, without caches.
        With --num_experts: `experts`, expert parallelism's hook (shard_parity/model/moe.py;
        explicit/ep.py's all_to_all); `moe_stats`, a list each MoE layer appends its auxiliary
        loss and dropped share to (tasks.lm_loss).
        `pipeline`: `(x, run_stack, weights) -> x` in place of the layer loop: pipeline
        parallelism's schedule (<twin>/pp.py), which runs `run_stack` on each stage's share of
        the stacked `weights`, microbatch by microbatch."""
        x = self.embedding(tokens, index, positions)  # [B, T, C]
        new_caches = []
        hooks = dict(sum_partials=sum_partials, attention=attention, experts=experts)
        if pipeline is not None:  # pipeline parallelism: the strategy runs the blocks
            run = functools.partial(self.run_stack, layer_weights=layer_weights, **hooks)
            x, stats = pipeline(x, run, nnx.split(self.blocks)[1])
            if moe_stats is not None and stats:
                moe_stats.append(stats)
        elif layer_weights is not None or (caches is None and self.cfg.remat_policy in REMAT):
            # FSDP: one layer's weights whole at a time; a remat policy: the scan's checkpoint
            weights = nnx.split(self.blocks)[1]
            x, stats = self.run_stack(weights, x, index, layer_weights, **hooks)
            if moe_stats is not None and stats:
                moe_stats.append(stats)
        else:  # layer by layer, unrolled
            for i, block in enumerate(self.layers()):
                cache = None if caches is None else caches[i]
                x, cache = block(x, cache, index, sum_partials, attention, experts, moe_stats)
                new_caches.append(cache)
        x = self.norm(x)
        table = self.embed.embedding[...]
        # the head, tied to the embedding: float32 logits (float64 under the bisector's --x64),
        # its weight gradient in the reduce dtype; in the table's own where that is x's already
        # (a copy in --dtype, as an evaluation's gathered one: its lookup's gradient is in that
        # dtype, and the two add; FSDP's training step holds its gathered copy in float32)
        grad = None if table.dtype == x.dtype else self.cfg.reduce_dtype
        logits = product(x, table.astype(x.dtype), True, wide(x.dtype), grad)
        return logits, (None if caches is None else new_caches)

    def embedding(self, tokens, index=0, positions=None):
        """tokens i32[B, T] -> x f32[B, T, C]: the byte and position embeddings, what the blocks
        take in (a pipeline's first stage runs this alone: shard_parity/pipeline.py)."""
        if positions is None:
            positions = index + jnp.arange(tokens.shape[1])  # [T]
        if typed(tokens) is not None:  # Explicit mode: look positions up per row, as tokens
            positions = jax.reshard(jnp.broadcast_to(positions, tokens.shape), typed(tokens))
        x = lookup(self.embed, tokens)
        return x + lookup(self.pos, positions, x.shape)  # positions' rows broadcast, then cast

    def layers(self) -> list[Block]:
        """The L blocks, each a slice of the stacked params (the bisector names them blocks.i).
        One split per array, not L slices: its gradient is one concatenation, where L slices'
        would be L zero-padded arrays of the whole stack to add (auto's dp doubled its temp)."""
        graphdef, weights = nnx.split(self.blocks)
        leaves, treedef = jax.tree.flatten(weights)
        parts = [jnp.split(w, self.cfg.num_layers) for w in leaves]  # each [1, ...]
        return [
            nnx.merge(graphdef, jax.tree.unflatten(treedef, [jnp.squeeze(p[i], 0) for p in parts]))
            for i in range(self.cfg.num_layers)
        ]

    def run_stack(
        self, weights, x, index=0, layer_weights=None, sum_partials=None, attention=None,
        experts=None,
    ):  # fmt: skip
        """x: [b, T, C] through the layers whose stacked params are `weights` ([k, ...]: all L,
        or a pipeline stage's k consecutive layers), in order, under one `lax.scan`; returns
        (x, stats), stats the MoE layers' auxiliary loss and dropped share stacked [k] each
        ({} for dense blocks). With `layer_weights` (FSDP's per-layer gather) each layer's
        params as stored pass through it, by default under `jax.checkpoint` keeping only each
        layer's input x for the backward (`full`, nothing_saveable: a policy that saved all but
        `layer_weights`' outputs would still keep what the layer derives from them, a reshaped
        or cast kernel), so the backward calls `layer_weights` again and recomputes the layer:
        one layer's weights are whole at a time. --remat_policy overrides it (`none` keeps every
        layer's gathered weights for the backward). The hooks go into every layer's call."""
        hooks = dict(sum_partials=sum_partials, attention=attention, experts=experts)
        policy = self.cfg.remat_policy or ('full' if layer_weights else 'none')
        return jax.lax.scan(self.layer(index, layer_weights, hooks, policy), x, weights)

    def layer(self, index, layer_weights, hooks: dict, policy: str):
        """One block as `(x, w) -> (x, stats)`, w its params as stored, under `policy`'s
        jax.checkpoint (REMAT_POLICIES): the scan's body, or each unrolled layer's call."""
        graphdef = nnx.split(self.blocks)[0]

        def body(x, w):  # x: [b, T, C]; w: one layer's params, as stored
            block, stats = nnx.merge(graphdef, layer_weights(w) if layer_weights else w), []
            x = block(x, None, index, stats=stats, **hooks)[0]
            return x, (stats[0] if stats else {})

        return remat(body, policy)

    def init_caches(self, batch: int):
        """Empty KV caches: per layer two [B, seq_len, K, D] arrays in the compute dtype, the
        keys' and values' own (cuDNN refuses a bf16 query beside float32 keys)."""
        shape = (batch, self.cfg.seq_len, self.cfg.num_kv_heads, self.cfg.head_dim)
        dtype = self.cfg.compute_dtype
        return [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))] * self.cfg.num_layers
