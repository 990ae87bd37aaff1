"""Claim: the compiled explicit step holds the gradient all-reduce we wrote, the compiled auto
step holds the one the compiler inserted, both move exactly the gradient bytes (plus the two
metric scalars), and neither gathers the replicated parameters."""

import jax
import numpy as np
import pytest

from auto import train_step as auto
from explicit import train_step as explicit
from parity_tests.conftest import fresh_state
from parity_tests.hlo import collectives, compiled_text
from shard_parity.step import reference_train_step
from shard_parity.tasks import classification_loss

METRIC_BYTES = 2 * 4  # the mean loss and accuracy, f32 scalars, averaged with the gradients


def compiled_step_collectives(twin, mesh, mnist_batches):
    graphdef, tx, state = fresh_state()
    step = twin.train_step(graphdef, classification_loss, tx, mesh)
    args = twin.place_state(state, mesh), twin.place_batch(mnist_batches.batch(0), mesh)
    return collectives(compiled_text(step, *args))


def param_bytes():
    _, _, state = fresh_state()
    return sum(np.asarray(p).nbytes for p in jax.tree.leaves(state.params))


def test_the_one_device_reference_has_no_collective(mnist_batches):
    graphdef, tx, state = fresh_state()
    step = reference_train_step(graphdef, classification_loss, tx)
    assert collectives(compiled_text(step, state, mnist_batches.batch(0))) == []


@pytest.mark.parametrize('twin', [auto, explicit], ids=['auto', 'explicit'])
def test_step_all_reduces_the_gradients_once_and_gathers_nothing(twin, mesh8, mnist_batches):
    found = compiled_step_collectives(twin, mesh8, mnist_batches)
    assert found, 'a data-parallel step must hold at least one all-reduce'
    assert {c.kind for c in found} == {'all-reduce'}, found  # no all-gather of the params
    assert sum(c.bytes for c in found) == param_bytes() + METRIC_BYTES
    for c in found:
        assert set(c.dtypes) == {'f32'}
        assert c.group_size == 8, c.replica_groups  # one group: every device of the mesh


def test_twins_reduce_the_same_arrays(mesh8, mnist_batches):
    shapes = {}
    for twin in (auto, explicit):
        found = compiled_step_collectives(twin, mesh8, mnist_batches)
        # auto may lay a weight gradient out transposed ([out, in]): compare element counts.
        shapes[twin] = sorted(int(np.prod(s)) for c in found for s in c.shapes)
    assert shapes[auto] == shapes[explicit]
