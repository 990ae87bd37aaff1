"""Claim: on the same global batch, auto, explicit and a one-device jit give the same loss and
gradients (float32: rtol 1e-5, atol 1e-6), for the MLP and the transformer, and the explicit
gradient is the mean over devices, not the sum."""

from functools import partial

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from auto import train_step as auto
from explicit import train_step as explicit
from parity_tests.conftest import fresh_state
from shard_parity.mesh import DATA
from shard_parity.step import bind, reference_loss_and_grads

TOL = dict(rtol=1e-5, atol=1e-6)


def assert_trees_close(a, b, **tol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tol)


def twin_loss_and_grads(twin, mesh, graphdef, loss_fn, state, batch):
    fn = twin.loss_and_grads(graphdef, loss_fn, mesh)
    placed = twin.place_state(jax.tree.map(np.array, state), mesh)
    return fn(placed.params, twin.place_batch(batch, mesh))


@pytest.fixture(scope='module')
def reference(case):
    graphdef, _, state = fresh_state(case=case)
    batch = case.batches.batch(0)
    metrics, grads = reference_loss_and_grads(graphdef, case.loss_fn)(state.params, batch)
    return graphdef, state, batch, metrics, grads


def test_comparison_can_fail_on_another_batch(case, reference):
    graphdef, state, _, _, grads = reference
    _, other = reference_loss_and_grads(graphdef, case.loss_fn)(state.params, case.batches.batch(1))
    with pytest.raises(AssertionError):
        assert_trees_close(grads, other, **TOL)


@pytest.mark.parametrize('twin', [auto, explicit], ids=['auto', 'explicit'])
def test_twin_matches_one_device_reference(twin, mesh8, case, reference):
    graphdef, state, batch, ref_metrics, ref_grads = reference
    metrics, grads = twin_loss_and_grads(twin, mesh8, graphdef, case.loss_fn, state, batch)
    for key in ref_metrics:
        np.testing.assert_allclose(metrics[key], ref_metrics[key], **TOL)
    assert_trees_close(grads, ref_grads, **TOL)


def test_twins_agree_with_each_other(mesh8, case, reference):
    graphdef, state, batch, _, _ = reference
    _, a = twin_loss_and_grads(auto, mesh8, graphdef, case.loss_fn, state, batch)
    _, e = twin_loss_and_grads(explicit, mesh8, graphdef, case.loss_fn, state, batch)
    assert_trees_close(a, e, **TOL)


def test_gradient_without_the_varying_cast_is_the_sum(mesh8, case, reference):
    """The trap the explicit twin avoids: grad of invariant P() params already psums over
    devices, so a pmean after it returns n times the mean. The parity check above catches it."""
    graphdef, state, batch, _, ref_grads = reference
    grad_fn = jax.grad(lambda p, b: bind(graphdef, case.loss_fn)(p, b)[0])

    @jax.jit
    @partial(jax.shard_map, mesh=mesh8, in_specs=(P(), P(DATA)), out_specs=P())
    def without_cast(params, batch):
        return jax.lax.pmean(grad_fn(params, batch), DATA)  # no pcast to 'varying' first

    wrong = without_cast(state.params, explicit.place_batch(batch, mesh8))
    assert_trees_close(wrong, jax.tree.map(lambda g: 8 * g, ref_grads), rtol=1e-5, atol=8e-6)
    with pytest.raises(AssertionError):
        assert_trees_close(wrong, ref_grads, **TOL)
