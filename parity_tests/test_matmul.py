"""Claim: the backward of `matmul` (shard_parity/model/ops.py) gives JAX's own gradients, and with
it auto/'s compiled data-parallel step no longer transposes and copies the weight gradients (the
cause of auto's 0.66x speed on the MLP: docs/benchmarks.md)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from parity_tests.helpers import fresh_state, plan_of
from shard_parity import auto
from shard_parity.inspector.hlo import compiled_text
from shard_parity.model.ops import matmul
from shard_parity.placement import place_batch, place_state
from shard_parity.runtime.tasks import classification_loss


@pytest.mark.parametrize('transposed', [False, True], ids=['kernel', 'tied-head'])
@pytest.mark.parametrize('rows', [(6,), (2, 3)], ids=['2d', '3d'])
def test_gradients_equal_jaxs_own(rows, transposed):
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (*rows, 5))
    w = jax.random.normal(kw, (7, 5) if transposed else (5, 7))
    g = jax.random.normal(kg, (*rows, 7))
    plain = lambda x, w: jnp.sum(g * (x @ (w.T if transposed else w)))  # noqa: E731
    ours = lambda x, w: jnp.sum(g * matmul(x, w, transposed))  # noqa: E731
    np.testing.assert_allclose(ours(x, w), plain(x, w), rtol=1e-6)
    for a, b in zip(jax.grad(ours, (0, 1))(x, w), jax.grad(plain, (0, 1))(x, w), strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_auto_step_does_not_transpose_weight_gradients(mesh8, mnist_batches):
    graphdef, tx, state = fresh_state()
    step = auto.dp.train_step(graphdef, classification_loss, tx, mesh8, plan_of(mesh8, 'dp'))
    args = place_state(state, mesh8, plan_of(mesh8, 'dp')), place_batch(mnist_batches.batch(0), mesh8, plan_of(mesh8, 'dp'))
    text = compiled_text(step, *args)
    weights = {tuple(p.shape) for p in jax.tree.leaves(state.params) if p.ndim == 2}
    transposed = {
        tuple(int(d) for d in dims.split(','))
        for dims in re.findall(r'= f32\[([\d,]+)\]\{[\d,]+\} transpose\(', text)
    }
    assert re.search(r'all-reduce', text)  # the program we mean: the data-parallel step
    assert not transposed & (weights | {s[::-1] for s in weights}), transposed
