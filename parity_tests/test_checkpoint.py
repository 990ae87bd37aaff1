"""Claim: an Orbax checkpoint written by one twin restores, from its saved config alone, into a
fresh model on another mesh (for any twin: restoring places by strategy, never by twin), and
gives exactly the logits it gave before: between all three twins, from and onto auto/'s and
explicit/'s Auto meshes and typed/'s Explicit one, under another strategy and mesh shape."""

import jax
import numpy as np
import pytest
from flax import nnx

from parity_tests.helpers import (
    TINY_TRANSFORMER,
    fresh_state,
    logits,
    make_case,
    plan_of,
    save_checkpoint,
    strategy_mesh,
)
from shard_parity import UsageError, auto, explicit, typed
from shard_parity.mesh import make_mesh
from shard_parity.placement import place_batch, place_state
from shard_parity.runtime import checkpoint, legacy
from shard_parity import config as cfg
from shard_parity.step import TrainState


@pytest.fixture(scope='module')
def trained(mesh8, tmp_path_factory):
    """Three steps of the tiny transformer in auto/ on 8 devices, saved."""
    case = make_case('transformer')
    graphdef, tx, state = fresh_state(case=case)
    step = auto.dp.train_step(graphdef, case.loss_fn, tx, mesh8, plan_of(mesh8, 'dp'))
    state = place_state(state, mesh8, plan_of(mesh8, 'dp'))
    for i in range(3):
        state, metrics = step(state, place_batch(case.batches.batch(i), mesh8, plan_of(mesh8, 'dp')))
        jax.block_until_ready(metrics)  # one step in flight: the CPU deadlock (docs/running.md)
    workdir = tmp_path_factory.mktemp('ckpt')
    save_checkpoint(workdir, state, case)
    tokens = case.batches.batch(100)['x']
    return workdir, graphdef, state, tokens, logits(graphdef, state.params, tokens)


@pytest.mark.parametrize('n', [2, 1, 8])
def test_restore_into_a_fresh_model_gives_the_same_logits(trained, n):
    workdir, graphdef, state, tokens, before = trained
    fresh_graphdef, _, fresh = fresh_state(seed=7, case=make_case('transformer'))
    assert not np.allclose(logits(fresh_graphdef, fresh.params, tokens), before, atol=1e-3)

    saved, graphdef2, restored = checkpoint.restore(workdir, make_mesh(n))
    assert saved['model_config'] == cfg.to_dict(TINY_TRANSFORMER)
    assert int(restored.step) == 3
    leaf = jax.tree.leaves(restored.params)[0]
    assert len(leaf.sharding.device_set) == n and leaf.sharding.is_fully_replicated
    np.testing.assert_array_equal(logits(graphdef2, restored.params, tokens), before)
    for a, b in zip(jax.tree.leaves(restored.opt_state), jax.tree.leaves(state.opt_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(UsageError, match=f'no checkpoint in {tmp_path}/checkpoints'):
        checkpoint.restore(tmp_path, make_mesh(1))


TWINS = {'auto': auto, 'explicit': explicit, 'typed': typed}
# (twin, strategy, mesh) that saves -> (twin, strategy, mesh) that restores. Each twin's mesh
# has its AXIS_TYPE: Auto for auto/ and explicit/, Explicit for typed/ (the sharding is then
# part of each restored array's type, which typed/'s step checks).
MOVES = {  # tp's meshes split at most 2 ways over 'model': the tiny model has 2 KV heads
    'auto-dp-to-typed-fsdp_tp': (('auto', 'dp', (8, 1)), ('typed', 'fsdp_tp', (4, 2))),
    'typed-tp-to-explicit-fsdp': (('typed', 'tp', (4, 2)), ('explicit', 'fsdp', (8, 1))),
    'typed-fsdp-to-typed-tp': (('typed', 'fsdp', (8, 1)), ('typed', 'tp', (2, 2))),
    'explicit-fsdp_tp-to-auto-tp': (('explicit', 'fsdp_tp', (4, 2)), ('auto', 'tp', (2, 2))),
    'typed-fsdp_tp-to-auto-dp': (('typed', 'fsdp_tp', (2, 2)), ('auto', 'dp', (4, 1))),
}
FAST_MOVES = ('auto-dp-to-typed-fsdp_tp', 'typed-tp-to-explicit-fsdp')


@pytest.mark.parametrize(
    'saved_by, restored_by',
    [
        pytest.param(*move, id=name, marks=[] if name in FAST_MOVES else [pytest.mark.slow])
        for name, move in MOVES.items()
    ],
)
def test_checkpoints_move_between_twins_meshes_and_strategies(saved_by, restored_by, tmp_path):
    (a, strategy_a, shape_a), (b, strategy_b, shape_b) = saved_by, restored_by
    case = make_case('transformer')
    graphdef, tx, state = fresh_state(case=case)
    # One step of the saving twin, so the optimizer's moments are no longer zeros either.
    mesh_a = strategy_mesh(strategy_a, shape_a, TWINS[a])
    step = TWINS[a].STRATEGIES[strategy_a].train_step(graphdef, case.loss_fn, tx, mesh_a, plan_of(mesh_a, strategy_a))
    state, metrics = step(
        place_state(state, mesh_a, plan_of(mesh_a, strategy_a)),
        place_batch(case.batches.batch(0), mesh_a, plan_of(mesh_a, strategy_a)),
    )
    jax.block_until_ready(metrics)
    save_checkpoint(tmp_path, state, case)

    mesh_b = strategy_mesh(strategy_b, shape_b, TWINS[b])
    _, graphdef2, restored = checkpoint.restore(tmp_path, mesh_b, plan_of(mesh_b, strategy_b))
    saved_leaves, restored_leaves = jax.tree.leaves(state), jax.tree.leaves(restored)
    # First: the placement differs, so the comparisons below compare differently held arrays.
    assert mesh_a.axis_types != mesh_b.axis_types or mesh_a.devices.shape != shape_b
    assert any(s.sharding.spec != r.sharding.spec for s, r in zip(saved_leaves, restored_leaves))
    # Placed as the restoring twin places a new state on its own mesh (axis types included).
    own = place_state(jax.device_get(state), mesh_b, plan_of(mesh_b, strategy_b))
    for r, o in zip(restored_leaves, jax.tree.leaves(own), strict=True):
        assert r.sharding == o.sharding and jax.typeof(r) == jax.typeof(o)
    for s, r in zip(saved_leaves, restored_leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(r), np.asarray(s))
    tokens = case.batches.batch(100)['x']
    one = jax.devices()[0]  # logits on one device: both sides run the very same program
    np.testing.assert_array_equal(
        logits(graphdef2, restored.params, tokens, one), logits(graphdef, state.params, tokens, one)
    )


def test_a_checkpoint_of_per_layer_blocks_is_converted_on_read(tmp_path):
    """Before the blocks were stacked, a checkpoint held blocks/0/..., blocks/1/...: it restores
    into the stacked layout, each layer in its place, under any strategy (legacy.py)."""
    case = make_case('transformer')
    graphdef, tx, state = fresh_state(0, case)
    model = nnx.merge(graphdef, state.params)
    layers = nnx.List(model.layers())
    query = np.asarray(state.params['blocks']['attn']['query']['kernel'][...])
    assert not np.array_equal(query[0], query[1])  # layers in the wrong order would show
    model.blocks = layers  # the layout of the checkpoints written before the stacking
    old = nnx.state(model)
    moments = lambda p: jax.tree.map(lambda x: x + 1, tx.init(p))
    save_checkpoint(tmp_path, TrainState(state.step, old, moments(old)), case)
    with checkpoint.reader(tmp_path) as mngr:
        assert legacy.per_layer(mngr, 0)
    want = TrainState(state.step, state.params, moments(state.params))
    for strategy in ('dp', 'fsdp'):
        mesh = strategy_mesh(strategy)
        _, _, restored = checkpoint.restore(tmp_path, mesh, plan_of(mesh, strategy))
        for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(restored), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
