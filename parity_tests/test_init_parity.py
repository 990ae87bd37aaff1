"""Claim: every twin starts from the same parameters (one seed, one init, one placement rule
for all twins: shard_parity/placement.py), under dp placed whole on every device."""

import jax
import numpy as np

from parity_tests.helpers import fresh_state, plan_of
from shard_parity.placement import place_state


def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def test_different_seeds_give_different_parameters(mesh8):
    _, _, s0 = fresh_state(seed=0)
    _, _, s1 = fresh_state(seed=1)
    assert all(not np.array_equal(a, b) for a, b in zip(leaves(s0), leaves(s1)) if a.ndim == 2)


def test_one_seed_initialises_identical_replicated_parameters(mesh8):
    _, _, state = fresh_state(seed=0)
    _, _, again = fresh_state(seed=0)
    placed = place_state(jax.tree.map(np.array, state), mesh8, plan_of(mesh8, 'dp'))
    for x, y, z in zip(leaves(state), leaves(again), leaves(placed), strict=True):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)
    for p in jax.tree.leaves(placed):
        assert p.sharding.is_fully_replicated and len(p.sharding.device_set) == 8
