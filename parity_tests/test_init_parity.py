"""Claim: both twins start from the same parameters, placed replicated on every device."""

import jax
import numpy as np

from auto import train_step as auto
from explicit import train_step as explicit
from parity_tests.conftest import fresh_state


def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def test_different_seeds_give_different_parameters(mesh8):
    _, _, s0 = fresh_state(seed=0)
    _, _, s1 = fresh_state(seed=1)
    assert all(not np.array_equal(a, b) for a, b in zip(leaves(s0), leaves(s1)) if a.ndim == 2)


def test_twins_initialise_identical_replicated_parameters(mesh8):
    _, _, state = fresh_state(seed=0)
    a = auto.place_state(state, mesh8)
    e = explicit.place_state(jax.tree.map(np.array, state), mesh8)
    for x, y in zip(leaves(a), leaves(e)):
        np.testing.assert_array_equal(x, y)
    for twin_state in (a, e):
        for p in jax.tree.leaves(twin_state):
            assert p.sharding.is_fully_replicated and len(p.sharding.device_set) == 8
