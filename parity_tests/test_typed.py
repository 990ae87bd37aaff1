"""Claim: typed/ (JAX's Explicit mode) carries the lesson in its types, and trains as the others.

Read while the step is traced (no jax.debug, nothing run): the batch is `P('data')`; inside the
loss each weight matrix is `reduced` over 'data'; each gradient comes out `unreduced` over 'data'
and is reduced once, at the strategy's `reshard`; under tp a row-parallel product leaves its
sums `unreduced` over 'model' for `sum_partials`. Then the numbers: the MLP trains bitwise as
explicit/ does, and the transformer's dp and tp steps match the one-device run. The full grid
(every strategy x mesh, both models) is test_mesh_parity.py's slow tier."""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType

from parity_tests.helpers import (
    TOL,
    assert_close,
    assert_trees_close,
    fresh_state,
    make_case,
    plan_of,
    strategy_mesh,
    train_twin,
    twin_loss_and_grads,
)
from shard_parity import auto, explicit, typed
from shard_parity.mesh import DATA, MODEL, make_mesh
from shard_parity.placement import layer_dims, place_batch, place_state
from shard_parity.step import one_device_loss_and_grads


def spec(x):
    return jax.typeof(x).sharding.spec


@pytest.fixture
def reshards(monkeypatch):
    """Every `jax.reshard` the step traces: (the types of its input, its target)."""
    seen, real = [], jax.reshard

    def spy(x, shardings):
        seen.append((jax.tree.map(jax.typeof, x), shardings))
        return real(x, shardings)

    monkeypatch.setattr(jax, 'reshard', spy)
    return seen


def traced_dp_types(reshards, case, mesh):
    """(batch type, params' types inside the loss, gradient types before their reduction)."""
    inside = {}

    def loss_fn(model, batch):
        inside['batch'] = jax.tree.map(jax.typeof, batch)
        inside['params'] = jax.tree.map(lambda p: jax.typeof(p[...]), nnx_params(model))
        return case.loss_fn(model, batch)

    graphdef, _, state = fresh_state(case=case)
    twin_loss_and_grads(typed, mesh, graphdef, loss_fn, state, case.batches.batch(0))
    # the first is the cast to reduced, the last the one reduction (the transformer reshards
    # its positions in between)
    (_, to_reduced), (grad_types, _) = reshards[0], reshards[-1]
    return inside, to_reduced, grad_types


def nnx_params(model):
    from flax import nnx

    return nnx.state(model, nnx.Param)


def test_the_mesh_is_explicit_and_the_others_are_not():
    assert typed.AXIS_TYPE == AxisType.Explicit and explicit.AXIS_TYPE == AxisType.Auto
    mesh = make_mesh(8, axis_type=typed.AXIS_TYPE)
    assert mesh.axis_types == (AxisType.Explicit,) * 2


def test_dp_types_read_while_tracing(reshards, case):
    mesh = make_mesh(8, axis_type=typed.AXIS_TYPE)
    inside, _, grad_types = traced_dp_types(reshards, case, mesh)
    for t in jax.tree.leaves(inside['batch']):
        assert t.sharding.spec.partitions[0] == DATA  # the batch: P('data')
    params = jax.tree_util.tree_leaves_with_path(inside['params'])
    for (path, t), g in zip(params, jax.tree.leaves(grad_types), strict=True):
        matrix = t.ndim - layer_dims(path) >= 2  # a stacked LayerNorm scale [L, C]: a vector
        # a matrix is whole on every device, reduced over 'data': its gradient comes out
        # unreduced (partial sums) until the strategy's one reshard adds them
        assert t.sharding.spec.reduced == (frozenset({DATA}) if matrix else frozenset())
        assert g.sharding.spec.unreduced == (frozenset({DATA}) if matrix else frozenset())
        assert all(p is None for p in g.sharding.spec.partitions)  # never split under dp


def test_tp_row_parallel_product_is_unreduced_over_model(monkeypatch, case):
    seen = []
    real = typed.tp.sum_partials
    monkeypatch.setattr(
        typed.tp, 'sum_partials', lambda y: (seen.append(jax.typeof(y)), real(y))[1]
    )
    mesh = make_mesh(shape=(4, 2), axis_type=typed.AXIS_TYPE)
    graphdef, _, state = fresh_state(case=case)
    twin_loss_and_grads(typed, mesh, graphdef, case.loss_fn, state, case.batches.batch(0), 'tp')
    assert seen, 'the row-parallel layers call sum_partials'
    for t in seen:  # f32[B@data, (T,) C]{U:model}: each model device's partial sum
        assert t.sharding.spec.unreduced == {MODEL}
        assert t.sharding.spec.partitions[0] == DATA


def test_forgetting_the_reduction_is_refused_by_the_types(monkeypatch, case):
    """The comparison below can fail, and the types catch the slip: without sum_partials's
    reshard, the next nonlinear op (ReLU, or the residual's LayerNorm) meets partial sums."""
    monkeypatch.setattr(typed.tp, 'sum_partials', lambda y: y)
    mesh = make_mesh(shape=(4, 2), axis_type=typed.AXIS_TYPE)
    graphdef, _, state = fresh_state(case=case)
    with pytest.raises(Exception, match='unreduced'):
        twin_loss_and_grads(typed, mesh, graphdef, case.loss_fn, state, case.batches.batch(0), 'tp')


@pytest.mark.parametrize('strategy, shape', [('dp', (8, 1)), ('tp', (4, 2))])
def test_matches_the_one_device_run(strategy, shape, case):
    graphdef, _, state = fresh_state(case=case)
    batch = case.batches.batch(0)
    want_metrics, want_grads = one_device_loss_and_grads(graphdef, case.loss_fn)(
        state.params, batch
    )
    mesh = make_mesh(shape=shape, axis_type=typed.AXIS_TYPE)
    metrics, grads = twin_loss_and_grads(
        typed, mesh, graphdef, case.loss_fn, state, batch, strategy
    )
    other = case.batches.batch(1)  # first: the comparison can fail
    other_metrics, _ = one_device_loss_and_grads(graphdef, case.loss_fn)(state.params, other)
    assert not np.allclose(other_metrics['loss'], metrics['loss'], **TOL)
    assert_close(metrics['loss'], want_metrics['loss'], 'loss', **TOL)
    assert_trees_close(grads, want_grads, **TOL)


def test_mlp_trains_bitwise_as_explicit():
    """20 AdamW steps, dp on 8 devices: typed/ and explicit/ give identical bits."""
    case = make_case('mlp')
    t_losses, t_params = train_twin(typed, make_mesh(8, axis_type=typed.AXIS_TYPE), case)
    e_losses, e_params = train_twin(explicit, make_mesh(8), case)
    assert t_losses[0] != t_losses[-1]  # it trained: the compared runs can differ
    np.testing.assert_array_equal(t_losses, e_losses)
    for t, e in zip(t_params, e_params, strict=True):
        np.testing.assert_array_equal(t, e)


@pytest.mark.parametrize(
    'twin, strategy, shape',
    [('typed', 'dp', (8, 1)), ('typed', 'fsdp_tp', (4, 2)), ('auto', 'tp', (4, 2))],
)
def test_the_train_step_compiles_once(twin, strategy, shape):
    """The state a step returns is typed as the one it took (placement.as_returned), so the
    second step reuses the first one's compilation. Before, typed/'s outputs came back
    P(None, None) for a state placed P() (another type on an Explicit mesh), and auto/'s tp
    P('model') for P('model', None): each step 2 compiled again, inside the train CLI's timer."""
    twin = {'typed': typed, 'auto': auto}[twin]
    case = make_case('mlp')
    graphdef, tx, state = fresh_state(case=case)
    mesh = strategy_mesh(strategy, shape, twin)
    step = twin.STRATEGIES[strategy].train_step(graphdef, case.loss_fn, tx, mesh, plan_of(mesh, strategy))
    state = place_state(state, mesh, plan_of(mesh, strategy))
    for i in range(3):
        state, metrics = step(state, place_batch(case.batches.batch(i), mesh, plan_of(mesh, strategy)))
        jax.block_until_ready(metrics)
    assert step._cache_size() == 1
