"""Claim: an Orbax checkpoint written by one twin restores, from its saved config alone, into a
fresh model on another mesh (for any twin: restoring places by strategy, never by twin), and
gives exactly the logits it gave before."""

import jax
import numpy as np
import pytest

import auto
from parity_tests.helpers import TINY_TRANSFORMER, fresh_state, logits, make_case, save_checkpoint
from shard_parity import UsageError
from shard_parity.mesh import make_mesh
from shard_parity.placement import place_batch, place_state
from shard_parity.runtime import checkpoint
from shard_parity.runtime import config as cfg


@pytest.fixture(scope='module')
def trained(mesh8, tmp_path_factory):
    """Three steps of the tiny transformer in auto/ on 8 devices, saved."""
    case = make_case('transformer')
    graphdef, tx, state = fresh_state(case=case)
    step = auto.dp.train_step(graphdef, case.loss_fn, tx, mesh8)
    state = place_state(state, mesh8, 'dp')
    for i in range(3):
        state, metrics = step(state, place_batch(case.batches.batch(i), mesh8))
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
