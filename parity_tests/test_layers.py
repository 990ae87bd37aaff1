"""shard_parity/model/ops.py's GELU and LayerNorm compute what jax.nn.gelu(approximate=False) and
nnx.LayerNorm compute, values and gradients, to float32 round-off."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from shard_parity.model.ops import LayerNorm, erf, gelu


def test_erf_is_within_its_stated_error():
    x = np.linspace(-10, 10, 400_001, dtype=np.float32)
    exact = np.vectorize(math.erf)(x.astype(np.float64))
    ours = np.asarray(erf(jnp.asarray(x)), np.float64)
    assert np.abs(ours - exact).max() < 4.5e-7
    # It is our polynomial being measured, not XLA's erf under another name.
    assert not np.array_equal(ours, np.asarray(jax.lax.erf(jnp.asarray(x)), np.float64))


def _cotangent(shape, seed=9):
    return jax.random.normal(jax.random.key(seed), shape)


def test_gelu_and_its_gradient_match_jax_exact_gelu():
    x = 4 * jax.random.normal(jax.random.key(0), (8, 64, 96))
    w = _cotangent(x.shape)
    exact = lambda x: jax.nn.gelu(x, approximate=False)  # noqa: E731
    tanh = lambda x: jax.nn.gelu(x, approximate=True)  # noqa: E731
    # The tolerance separates exact GELU from its tanh approximation.
    assert np.abs(exact(x) - tanh(x)).max() > 1e-4
    np.testing.assert_allclose(gelu(x), exact(x), rtol=1e-6, atol=2e-6)
    grads = [jax.grad(lambda x, f=f: (f(x) * w).sum())(x) for f in (gelu, exact)]
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=2e-6)


def test_gelu_keeps_bfloat16():
    """bfloat16 in, bfloat16 out, computed in float32: within bfloat16's rounding of the exact
    GELU and its gradient. (bfloat16 cannot tell exact from tanh GELU; the float32 test does.)"""
    x = jnp.linspace(-3, 3, 64, dtype=jnp.bfloat16)
    y, dy = gelu(x), jax.grad(lambda x: gelu(x).astype(jnp.float32).sum())(x)
    assert y.dtype == dy.dtype == jnp.bfloat16
    x32 = x.astype(jnp.float32)
    exact = jax.grad(lambda x: jax.nn.gelu(x, approximate=False).sum())
    np.testing.assert_allclose(y.astype(np.float32), gelu(x32), rtol=8e-3, atol=1e-3)
    np.testing.assert_allclose(dy.astype(np.float32), exact(x32), rtol=8e-3, atol=1e-3)


@pytest.fixture
def norms():
    ref = nnx.LayerNorm(
        128, epsilon=1e-5, use_bias=False, use_fast_variance=False, rngs=nnx.Rngs(0)
    )
    ours = LayerNorm(128, epsilon=1e-5, rngs=nnx.Rngs(0))
    scale = 1 + 0.5 * jax.random.normal(jax.random.key(1), (128,))
    ref.scale[...], ours.scale[...] = scale, scale
    return ref, ours


def test_layer_norm_has_nnx_layer_norms_state(norms):
    ref, ours = norms
    assert jax.tree.structure(nnx.state(ref)) == jax.tree.structure(nnx.state(ours))


def test_layer_norm_draws_the_key_nnx_draws():
    """So that a seed initialises every other layer of the model as it did with nnx.LayerNorm."""
    keys = []
    for make in (
        lambda r: nnx.LayerNorm(8, use_bias=False, rngs=r),
        lambda r: LayerNorm(8, rngs=r),
    ):
        rngs = nnx.Rngs(0)
        make(rngs)
        keys.append(jax.random.key_data(rngs.params()))
    np.testing.assert_array_equal(keys[0], keys[1])
    rngs = nnx.Rngs(0)
    assert not np.array_equal(keys[0], jax.random.key_data(rngs.params()))  # a draw does move it


def test_layer_norm_and_its_gradients_match_nnx(norms):
    ref, ours = norms
    x = 2 + 3 * jax.random.normal(jax.random.key(2), (6, 64, 128))
    w = _cotangent(x.shape)
    # What the tolerance has to tell apart: the same norm with the default scale of ones.
    plain = LayerNorm(128, rngs=nnx.Rngs(0))
    assert np.abs(plain(x) - ref(x)).max() > 1e-2
    np.testing.assert_allclose(ours(x), ref(x), rtol=1e-5, atol=2e-6)

    def loss(model, x):
        return (model(x) * w).sum()

    (g_ref, dx_ref), (g_ours, dx_ours) = (nnx.grad(loss, argnums=(0, 1))(m, x) for m in (ref, ours))
    np.testing.assert_allclose(dx_ours, dx_ref, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(g_ours['scale'][...], g_ref['scale'][...], rtol=1e-5, atol=1e-4)


def test_layer_norm_in_bfloat16_returns_bfloat16_computed_in_float32(norms):
    """With dtype=bfloat16 (the transformer's --dtype=bfloat16) the output is bfloat16, and it is
    the float32 result rounded once. nnx.LayerNorm rounds the scale to bfloat16 before it
    multiplies, so the two differ by up to one bfloat16 step there: not compared."""
    _, ours = norms
    x = 2 + 3 * jax.random.normal(jax.random.key(3), (4, 16, 128))
    half = LayerNorm(128, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    half.scale[...] = ours.scale[...]
    y = half(x.astype(jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    want = ours(x.astype(jnp.bfloat16).astype(jnp.float32)).astype(jnp.bfloat16)
    np.testing.assert_array_equal(y.astype(np.float32), want.astype(np.float32))
