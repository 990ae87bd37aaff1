"""A mixture-of-experts feed-forward layer (Switch Transformer, GShard), for the transformer's
blocks when --num_experts > 0. It knows nothing of meshes.

Each token's router (float32, whatever the compute dtype) scores the E experts; the token goes
to its top K, each output weighted by that expert's softmax probability (the gate; not
renormalised over the K, so that the router learns from the loss with K = 1 too). Each expert
takes at most `capacity` tokens of each sequence: ceil(capacity_factor * T * K / E), at most T.
The group is the sequence, so capacity and drops never depend on how a mesh splits the batch.
Tokens past capacity are dropped (their expert adds nothing; the residual carries them) in one
stated order: every token's first choice before any second choice, then by position. The
Switch load-balancing loss, E * sum_e f_e * P_e (f_e: the share of the sequence's K choices
that picked e, before drops; P_e: its mean probability), is computed per sequence and averaged.

Two ways to run the experts, equal to float32 round-off (parity_tests/test_ep.py):
- no `experts` hook: a plain loop over the experts, each gathering its capacity's tokens with
  its own slice of the dispatch mask. This is the one-device reference;
- `experts(xe, ffn)`: the dispatch einsum gathers every expert's tokens at once,
  xe: [E, B, capacity, C]; the hook runs `ffn` (all experts, batched on their leading [E]
  dimension) wherever it puts them, and returns [E, B, capacity, C] for the combine einsum.
  Expert parallelism is that hook: explicit/ep.py's all_to_all to the experts' devices and
  back, auto/ep.py's sharding constraints.
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from shard_parity import UsageError
from shard_parity.model import ops
from shard_parity.model.ops import gelu, typed_partials, wide

normal = nnx.initializers.normal
AUX_WEIGHT = 0.01  # Switch Transformer's coefficient of the load-balancing loss


def check_experts(cfg) -> None:
    """The MoE settings of a TransformerConfig, one line each (docs/errors.md)."""
    e, k, factor = cfg.num_experts, cfg.experts_per_token, cfg.capacity_factor
    if e < 0:
        raise UsageError(f'--num_experts={e} must be 0 (the dense model) or more')
    if e and not 1 <= k <= e:
        raise UsageError(
            f'--experts_per_token={k} must be between 1 and --num_experts={e}: each token '
            'goes to that many different experts'
        )
    if e and not (math.isfinite(factor) and factor > 0):
        raise UsageError(
            f'--capacity_factor={factor} must be above 0 with --num_experts={e}: each expert '
            'takes ceil(factor * seq_len * K / E) tokens per sequence (1.0: the even share)'
        )


def capacity(cfg, seq_len: int) -> int:
    """Slots per expert per sequence: ceil(capacity_factor * T * K / E), between 1 and T."""
    slots = math.ceil(cfg.capacity_factor * seq_len * cfg.experts_per_token / cfg.num_experts)
    return max(1, min(seq_len, slots))


class Routing(NamedTuple):
    dispatch: jax.Array  # [B, T, E, cap]: 1 where token t fills slot c of expert e
    combine: jax.Array  # [B, T, E, cap]: dispatch times the gate
    aux: jax.Array  # f32[]: Switch's load-balancing loss, the mean over sequences
    dropped: jax.Array  # f32[]: the share of the K choices dropped for capacity


def route(x, router, k: int, cap: int) -> Routing:
    """x: [B, T, C], router: f32[C, E] -> each token's top-k experts and slots."""
    b, t, _ = x.shape
    e = router.shape[-1]
    f = wide(x.dtype)
    probs = jax.nn.softmax(jnp.einsum('btd,de->bte', x.astype(f), router.astype(f)), -1)
    gates, choice = jax.lax.top_k(probs, k)  # [B, T, K] each
    # One row per (choice rank, position): all first choices, then all second, by position.
    picks = ops.merge(jax.nn.one_hot(choice, e, dtype=f).transpose(0, 2, 1, 3), 1, 2)  # [B, KT, E]
    slot = (
        jnp.cumsum(picks, 1).astype(jnp.int32) - 1
    )  # the place in the expert's queue, counted in that order
    kept = picks * (slot < cap)
    slots = jax.nn.one_hot(slot, cap, dtype=f) * kept[..., None]  # [B, K*T, E, cap]
    slots = ops.split(slots, 1, (k, t))  # [B, K, T, E, cap] (ops: in Explicit mode B keeps its split)
    dispatch = slots.sum(1)  # a token picks an expert once: at most one 1 per (t, e)
    combine = jnp.einsum('bktec,btk->btec', slots, gates)
    share = picks.mean(1)  # [B, E]: f_e, the share of the sequence's choices
    aux = (e * jnp.sum(share * probs.mean(1), -1)).mean()
    # the choices dropped, counted (exact): 1 - kept / (K T) cancelled to a rounding's 1e-7
    # where none was, which one device's mean over 3 rows made and a pipeline's of one did not
    dropped = (k * t - kept.sum((1, 2))).mean() / (k * t)  # (a fuzzer find, 2026-12-05)
    return Routing(dispatch.astype(x.dtype), combine.astype(x.dtype), aux, dropped)


class Experts(nnx.Module):
    """E feed-forward networks, stacked: up f32[E, C, 4C], down f32[E, 4C, C] (in the
    transformer's stacked blocks f32[L, E, ...]; expert parallelism splits E)."""

    def __init__(self, cfg, rngs: nnx.Rngs):
        c, e = cfg.embed_dim, cfg.num_experts
        down_std = 0.02 / math.sqrt(2 * cfg.num_layers)  # nanoGPT's residual-projection init
        self.up = nnx.Param(normal(0.02)(rngs.params(), (e, c, 4 * c)))
        self.down = nnx.Param(normal(down_std)(rngs.params(), (e, 4 * c, c)))

    def __call__(self, x, sum_partials=None):  # x: [E', N, cap, C], E' the experts held here
        h = gelu(jnp.einsum('encd,edh->ench', x, self.up[...].astype(x.dtype)))
        down = self.down[...].astype(x.dtype)  # Explicit mode, h's 4C split: partial sums, said
        y = jnp.einsum('ench,ehd->encd', h, down, out_sharding=typed_partials(h, down, False))
        return added(y, sum_partials)

    def one(self, i: int, x, sum_partials=None):  # expert i alone: x [B, cap, C]
        h = gelu(jnp.einsum('bcd,dh->bch', x, self.up[i].astype(x.dtype)))
        down = self.down[i].astype(x.dtype)  # as __call__'s: h's 4C split gives partial sums
        y = jnp.einsum('bch,hd->bcd', h, down, out_sharding=typed_partials(h, down, False))
        return added(y, sum_partials)


def added(y, sum_partials):
    """Under explicit tensor parallelism each device holds 4C/m of every expert's hidden units
    (up split by columns, down by rows, as the dense feed-forward): its down product is a
    partial sum, which `sum_partials` adds over 'model'."""
    return y if sum_partials is None else sum_partials(y)


class MoE(nnx.Module):
    def __init__(self, cfg, rngs: nnx.Rngs):
        self.cfg = cfg
        shape = (cfg.embed_dim, cfg.num_experts)
        self.router = nnx.Param(normal(0.02)(rngs.params(), shape))  # f32[C, E]
        self.experts = Experts(cfg, rngs)

    def __call__(self, x, experts=None, stats=None, sum_partials=None):  # x: [B, T, C]
        # Explicit mode: each sequence whole (the routing's queues and means run along it;
        # typed/ splits T over a 'seq' axis, here of size 1: more is refused with experts, and
        # placement.reduced_shardings leaves 'seq' out of the MoE weights'), y split back as x
        y = self.routed(ops.whole(x, 1), experts, stats, sum_partials)
        return y if ops.typed(x) is None else jax.reshard(y, ops.typed(x))

    def routed(self, x, experts, stats, sum_partials):
        cfg = self.cfg
        r = route(x, self.router[...], cfg.experts_per_token, capacity(cfg, x.shape[1]))
        if stats is not None:  # the loss adds aux; the metrics log both (tasks.lm_loss)
            stats.append({'aux': r.aux, 'dropped': r.dropped})
        if experts is None:  # the one-device reference: one expert at a time
            y = jnp.zeros_like(x)
            for i in range(cfg.num_experts):
                xi = jnp.einsum('btc,btd->bcd', r.dispatch[:, :, i], x)  # [B, cap, C]
                yi = self.experts.one(i, xi, sum_partials)
                y = y + jnp.einsum('btc,bcd->btd', r.combine[:, :, i], yi)
            return y
        xe = jnp.einsum('btec,btd->ebcd', r.dispatch, x)  # [E, B, cap, C]: each expert's tokens
        ffn = functools.partial(self.experts, sum_partials=sum_partials)
        ye = experts(xe, ffn)  # the experts' outputs, in the same slots
        return jnp.einsum('btec,ebcd->btd', r.combine, ye)
