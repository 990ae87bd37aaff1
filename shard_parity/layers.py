"""The transformer's GELU and LayerNorm, each with a hand-written backward.

They compute what `jax.nn.gelu(x, approximate=False)` and `nnx.LayerNorm(use_bias=False,
use_fast_variance=False)` compute (parity_tests/test_layers.py holds them to it), but faster on
XLA:CPU. Profiling the nanoGPT configuration's step on one device (benchmarks, section 5) found:

- `jax.nn.gelu` goes through `erfc`, which XLA:CPU evaluates with a branch and an `exp`, and
  autodiff evaluates it again in the backward. With fused multiply-adds off (the default,
  shard_parity/mesh.py), XLA's own `erf` runs 12x slower than with them: 2.5 ms per
  [768, 512] call against 0.2. Here `erf` is a rational polynomial of plain multiplies, adds
  and one divide (0.16 ms for that call, FMA off), and the backward reuses the forward's Φ(x)
  instead of differentiating the polynomial.
- LayerNorm's autodiff backward materialises broadcasts of its statistics; the closed form
  below reads the normalised input once.

Together they took the step from 50 to 45 ms (`python -m benchmarks.run --sections=nanogpt`).
Both compute in float32 and return the input's dtype (LayerNorm: its `dtype`, which the
transformer sets to its compute dtype, as it did for nnx.LayerNorm). In bfloat16 they are not
nnx's to the bit: nnx.LayerNorm rounds its scale to bfloat16 before multiplying, this one
multiplies in float32 and rounds once.
"""

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from shard_parity.matmul import vary_like

# erf(x) ~ x * P(x^2) / Q(x^2) on [-4, 4] and +-1 beyond: the float32 rational approximation
# of Eigen's generic_fast_erf_float. Within 4.5e-7 of the true erf (test_layers.py measures it).
_ERF_P = (
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
)
_ERF_Q = (
    -1.45660718464996e-05,
    -2.13374055278905e-04,
    -1.68282697438203e-03,
    -7.37332916720468e-03,
    -1.42647390514189e-02,
)
_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def erf(x):
    """float32 erf from multiplies, adds and one divide (Horner's rule)."""
    x = jnp.clip(x, -4.0, 4.0)
    x2 = x * x
    p, q = _ERF_P[0], _ERF_Q[0]
    for c in _ERF_P[1:]:
        p = p * x2 + c
    for c in _ERF_Q[1:]:
        q = q * x2 + c
    return x * p / q


def _cdf(x):  # Φ(x), the standard normal CDF
    return 0.5 * (1.0 + erf(x * _SQRT_HALF))


@jax.custom_vjp
def gelu(x):
    """Exact GELU, x * Φ(x), as nanoGPT's nn.GELU() (not the tanh approximation)."""
    return _gelu_fwd(x)[0]


def _gelu_fwd(x):
    x32 = x.astype(jnp.float32)
    cdf = _cdf(x32)
    return (x32 * cdf).astype(x.dtype), (x32, cdf)


def _gelu_bwd(saved, g):  # d/dx x Φ(x) = Φ(x) + x φ(x)
    x, cdf = saved
    pdf = jnp.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return ((g.astype(jnp.float32) * (cdf + x * pdf)).astype(g.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def layer_norm(x, scale, epsilon: float):
    """(x - mean) / sqrt(var + epsilon) * scale over the last axis; no bias."""
    return _layer_norm_fwd(x, scale, epsilon)[0]


def _layer_norm_fwd(x, scale, epsilon):
    x32 = x.astype(jnp.float32)
    centred = x32 - x32.mean(-1, keepdims=True)
    inv_std = jax.lax.rsqrt((centred * centred).mean(-1, keepdims=True) + epsilon)
    normed = centred * inv_std
    return (normed * scale).astype(x.dtype), (normed, inv_std, scale)


def _layer_norm_bwd(epsilon, saved, g):
    normed, inv_std, scale = saved
    g32 = g.astype(jnp.float32)
    gs = g32 * scale
    dx = inv_std * (
        gs - gs.mean(-1, keepdims=True) - normed * (gs * normed).mean(-1, keepdims=True)
    )
    dscale = (g32 * normed).reshape(-1, normed.shape[-1]).sum(0).astype(scale.dtype)
    return dx.astype(g.dtype), dscale


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


class LayerNorm(nnx.Module):
    """nnx.LayerNorm(use_bias=False)'s parameter (`scale`, ones) and output, with the backward
    above. Same state, so checkpoints written with nnx.LayerNorm restore into it."""

    def __init__(self, num_features: int, *, rngs: nnx.Rngs, epsilon: float = 1e-5, dtype=None):
        rngs.params()  # the key nnx.LayerNorm draws for its scale: later layers' draws stay put
        self.scale = nnx.Param(jnp.ones((num_features,), jnp.float32))
        self.epsilon, self.dtype = epsilon, dtype

    def __call__(self, x):
        x = x if self.dtype is None else x.astype(self.dtype)
        # Inside shard_map, the scale first varies as x does, as it would in JAX's own multiply
        # (a custom backward must return each gradient with its input's type): the cast then
        # transposes into a sum of the scale's gradient over devices, as autodiff's would.
        return layer_norm(x, vary_like(self.scale[...], x), self.epsilon)
