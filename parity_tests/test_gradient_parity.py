"""Claim: on the same global batch, auto, explicit, typed and a one-device jit give the same loss
and gradients (float32: rtol 1e-5, atol 1e-6), for the MLP and the transformer, and the explicit
gradient is the mean over devices, not the sum."""

from functools import partial

import jax
import pytest
from jax.sharding import PartitionSpec as P

from parity_tests.helpers import (
    TOL,
    assert_close,
    assert_trees_close,
    fresh_state,
    plan_of,
    strategy_mesh,
    twin_loss_and_grads,
)
from shard_parity import auto, explicit, typed
from shard_parity.mesh import DATA
from shard_parity.placement import place_batch
from shard_parity.step import bind, one_device_loss_and_grads

TWINS = [auto, explicit, typed]
IDS = ['auto', 'explicit', 'typed']


@pytest.fixture(scope='module')
def one_device(case):
    graphdef, _, state = fresh_state(case=case)
    batch = case.batches.batch(0)
    metrics, grads = one_device_loss_and_grads(graphdef, case.loss_fn)(state.params, batch)
    return graphdef, state, batch, metrics, grads


def test_comparison_can_fail_on_another_batch(case, one_device):
    graphdef, state, _, _, grads = one_device
    _, other = one_device_loss_and_grads(graphdef, case.loss_fn)(
        state.params, case.batches.batch(1)
    )
    with pytest.raises(AssertionError):
        assert_trees_close(grads, other, **TOL)


@pytest.mark.parametrize('twin', TWINS, ids=IDS)
def test_twin_matches_the_one_device_run(twin, case, one_device):
    graphdef, state, batch, want_metrics, want_grads = one_device
    mesh = strategy_mesh('dp', twin=twin)  # 8 devices on 'data'; typed's axes are Explicit
    metrics, grads = twin_loss_and_grads(twin, mesh, graphdef, case.loss_fn, state, batch)
    for key in want_metrics:
        assert_close(metrics[key], want_metrics[key], key, **TOL)
    assert_trees_close(grads, want_grads, **TOL)


def test_twins_agree_with_each_other(case, one_device):
    graphdef, state, batch, _, _ = one_device
    grads = {}
    for twin in TWINS:
        mesh = strategy_mesh('dp', twin=twin)
        _, grads[twin] = twin_loss_and_grads(twin, mesh, graphdef, case.loss_fn, state, batch)
    assert_trees_close(grads[auto], grads[explicit], **TOL)
    assert_trees_close(grads[typed], grads[explicit], **TOL)


def test_gradient_without_the_varying_cast_is_the_sum(mesh8, case, one_device):
    """The trap the explicit twin avoids: grad of invariant P() params already psums over
    devices, so a pmean after it returns n times the mean. The parity check above catches it."""
    graphdef, state, batch, _, want_grads = one_device
    grad_fn = jax.grad(lambda p, b: bind(graphdef, case.loss_fn)(p, b)[0])

    @jax.jit
    @partial(jax.shard_map, mesh=mesh8, in_specs=(P(), P(DATA)), out_specs=P())
    def without_cast(params, batch):
        return jax.lax.pmean(grad_fn(params, batch), DATA)  # no pcast to 'varying' first

    wrong = without_cast(state.params, place_batch(batch, mesh8, plan_of(mesh8, 'dp')))
    assert_trees_close(wrong, jax.tree.map(lambda g: 8 * g, want_grads), rtol=1e-5, atol=8e-6)
    with pytest.raises(AssertionError):
        assert_trees_close(wrong, want_grads, **TOL)
