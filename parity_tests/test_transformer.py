"""Claims about the transformer itself: naive and fused attention agree, MHA, GQA and MQA each
train in both twins, and bad shapes are refused with a clear message."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from parity_tests.helpers import (
    LOSS_TOL,
    TINY_TRANSFORMER,
    assert_close,
    fresh_state,
    make_case,
    plan_of,
)
from shard_parity import UsageError, auto, explicit
from shard_parity.model import attention
from shard_parity.model.transformer import Transformer
from shard_parity.placement import place_batch, place_state
from shard_parity import config as cfg
from shard_parity.runtime.tasks import lm_loss
from shard_parity.step import one_device_loss_and_grads

HEADS = {'mha': 4, 'gqa': 2, 'mqa': 1}  # key/value heads for 4 query heads
# The fast tier keeps GQA (the general case: K heads, each serving a group); MHA and MQA, its
# two ends, run in the full suite.
LAYOUTS = [
    pytest.param(k, id=name, marks=[] if name == 'gqa' else [pytest.mark.slow])
    for name, k in HEADS.items()
]
ATOL = dict(rtol=1e-5, atol=1e-6)


def qkv(kv_heads, t=16, s=16, seed=0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return (
        jax.random.normal(k1, (2, t, 4, 8)),
        jax.random.normal(k2, (2, s, kv_heads, 8)),
        jax.random.normal(k3, (2, s, kv_heads, 8)),
    )


@pytest.mark.parametrize('kv_heads', LAYOUTS)
def test_naive_and_fused_attention_agree(kv_heads):
    q, k, v = qkv(kv_heads)
    naive = attention.naive(q, k, v)
    assert not np.allclose(naive, attention.naive(*qkv(kv_heads, seed=1)), atol=1e-3)
    np.testing.assert_allclose(attention.fused(q, k, v), naive, rtol=1e-5, atol=1e-6)
    # With a cache: queries 5..7 over 16 slots of which 8 are written, and the same queries
    # seeing only the first 7 slots, so that `valid` masks a key the causal mask would show.
    q3 = q[:, :3]
    assert not np.allclose(attention.naive(q3, k, v, 5, 7), attention.naive(q3, k, v, 5, 8))
    for valid in (8, 7):
        np.testing.assert_allclose(
            attention.fused(q3, k, v, offset=5, valid=valid),
            attention.naive(q3, k, v, offset=5, valid=valid),
            rtol=1e-5,
            atol=1e-6,
        )


@pytest.mark.parametrize('kv_heads', LAYOUTS)
def test_blockwise_attention_over_several_key_blocks_matches_naive(kv_heads, monkeypatch):
    """19 positions in blocks of 5 keys: four blocks, the last one padded. Values and all three
    gradients, through the hand-written backward."""
    monkeypatch.setattr(attention, 'KEY_BLOCK', 5)
    q, k, v = qkv(kv_heads, t=19, s=19)
    w = jax.random.normal(jax.random.key(7), q.shape)
    grads = {
        f: jax.jit(jax.grad(lambda *x, f=f: (f(*x) * w).sum(), argnums=(0, 1, 2)))(q, k, v)
        for f in (attention.naive, attention.blockwise)
    }
    np.testing.assert_allclose(attention.blockwise(q, k, v), attention.naive(q, k, v), **ATOL)
    for a, b in zip(grads[attention.naive], grads[attention.blockwise]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=2e-6)
    q3 = q[:, :3]  # with a cache: queries 12..14 over 19 slots, 15 written or only 13 visible
    for valid in (15, 13):
        np.testing.assert_allclose(
            attention.blockwise(q3, k, v, offset=12, valid=valid),
            attention.naive(q3, k, v, offset=12, valid=valid),
            **ATOL,
        )


def test_blockwise_attention_keeps_no_score_matrix():
    """The backward's compiled temporaries: blockwise's grow as T (one [T, KEY_BLOCK] block at a
    time), naive's as T^2. Read from XLA's memory_analysis, not timed."""

    def temp(f, t):
        q = jnp.zeros((1, t, 4, 32))
        g = jax.jit(jax.grad(lambda q, k, v: f(q, k, v).sum(), argnums=(0, 1, 2)))
        return g.lower(q, q, q).compile().memory_analysis().temp_size_in_bytes

    naive = temp(attention.naive, 1024), temp(attention.naive, 2048)
    blockwise = temp(attention.blockwise, 1024), temp(attention.blockwise, 2048)
    assert naive[1] > 3.5 * naive[0]  # quadratic: the comparison can tell them apart
    assert blockwise[1] < 2.2 * blockwise[0]
    assert blockwise[1] < naive[1] / 4


def test_attention_is_causal():
    q, k, v = qkv(4)
    before = attention.naive(q, k, v)
    k2, v2 = k.at[:, 10:].set(0.0), v.at[:, 10:].set(0.0)  # change only the future of t < 10
    after = attention.naive(q, k2, v2)
    np.testing.assert_array_equal(before[:, :10], after[:, :10])
    assert not np.allclose(before[:, 10:], after[:, 10:])


@pytest.mark.parametrize('kv_heads', HEADS.values(), ids=HEADS.keys())
def test_models_with_naive_and_fused_attention_agree(kv_heads):
    case = make_case('transformer')
    batch = case.batches.batch(0)
    grads = {}
    for impl in ('naive', 'fused'):
        model_config = dataclasses.replace(TINY_TRANSFORMER, num_kv_heads=kv_heads, attention=impl)
        graphdef, params = nnx.split(Transformer(model_config, rngs=nnx.Rngs(0)))
        grads[impl] = one_device_loss_and_grads(graphdef, lm_loss)(params, batch)
    np.testing.assert_allclose(grads['naive'][0]['loss'], grads['fused'][0]['loss'], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads['naive'][1]), jax.tree.leaves(grads['fused'][1])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('kv_heads', LAYOUTS)
def test_each_head_layout_trains_in_both_twins(kv_heads, mesh8):
    case = make_case('transformer', dataclasses.replace(TINY_TRANSFORMER, num_kv_heads=kv_heads))
    losses = {}
    for twin in (auto, explicit):
        graphdef, tx, state = fresh_state(case=case)
        step = twin.dp.train_step(graphdef, case.loss_fn, tx, mesh8, plan_of(mesh8, 'dp'))
        state = place_state(state, mesh8, plan_of(mesh8, 'dp'))
        losses[twin] = []
        for i in range(10):
            state, metrics = step(state, place_batch(case.batches.batch(i), mesh8, plan_of(mesh8, 'dp')))
            losses[twin].append(float(metrics['loss']))
    assert losses[auto][-1] < losses[auto][0] - 0.3
    assert_close(losses[auto], losses[explicit], 'losses', **LOSS_TOL)  # helpers.py's model
    kernel = nnx.merge(graphdef, state.params).layers()[0].attn.key_value.kernel
    assert kernel.shape == (32, 2 * kv_heads * 8)  # K heads of size 8, for keys and values


@pytest.mark.parametrize(
    'changes, message',
    [
        (dict(num_heads=4, num_kv_heads=3), '--num_kv_heads=3 does not divide --num_heads=4'),
        (dict(embed_dim=30, num_heads=4), '--embed_dim=30 is not divisible by --num_heads=4'),
        (dict(seq_len=0), '--seq_len=0 must be at least 1'),
    ],
)
def test_bad_shapes_are_refused(changes, message):
    with pytest.raises(UsageError, match=message):
        dataclasses.replace(cfg.TransformerConfig(), **changes)


def test_bfloat16_compute_keeps_float32_parameters():
    model_config = dataclasses.replace(TINY_TRANSFORMER, dtype='bfloat16')
    graphdef, params = nnx.split(Transformer(model_config, rngs=nnx.Rngs(0)))
    assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype('float32')}
    # jitted: one compile each, where the model called eagerly compiled 108 ops one by one
    forward = jax.jit(lambda p, tokens: nnx.merge(graphdef, p)(tokens)[0])
    assert forward(params, jnp.zeros((2, 16), jnp.int32)).dtype == jnp.float32
    loss = jax.jit(lambda p, batch: lm_loss(nnx.merge(graphdef, p), batch)[0])
    assert np.isfinite(float(loss(params, make_case('transformer').batches.batch(0))))
