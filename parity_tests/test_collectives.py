"""Claim: the compiled explicit step holds the gradient all-reduce we wrote, the compiled auto
step holds the one the compiler inserted, typed's the one its `reshard` of `unreduced`
gradients asks for; each moves exactly the gradient bytes (plus the two metric scalars), and
none gathers the replicated parameters."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from parity_tests.helpers import REPO, fresh_state, inspect_collectives, plan_of, strategy_mesh
from shard_parity import auto, explicit, typed
from shard_parity.inspector.hlo import collectives, compiled_text
from shard_parity.placement import place_batch, place_state
from shard_parity.runtime.tasks import classification_loss
from shard_parity.step import one_device_train_step

METRIC_BYTES = 2 * 4  # the mean loss and accuracy, f32 scalars, averaged with the gradients
TWINS = [auto, explicit, typed]
IDS = ['auto', 'explicit', 'typed']


def compiled_step_collectives(twin, mnist_batches):
    """The collectives of `twin`'s dp step on 8 devices (its own mesh: typed's is Explicit)."""
    mesh = strategy_mesh('dp', twin=twin)
    graphdef, tx, state = fresh_state()
    step = twin.dp.train_step(graphdef, classification_loss, tx, mesh, plan_of(mesh, 'dp'))
    args = place_state(state, mesh, plan_of(mesh, 'dp')), place_batch(mnist_batches.batch(0), mesh, plan_of(mesh, 'dp'))
    return collectives(compiled_text(step, *args))


def param_bytes():
    _, _, state = fresh_state()
    return sum(np.asarray(p).nbytes for p in jax.tree.leaves(state.params))


def test_the_one_device_run_has_no_collective(mnist_batches):
    graphdef, tx, state = fresh_state()
    step = one_device_train_step(graphdef, classification_loss, tx)
    assert collectives(compiled_text(step, state, mnist_batches.batch(0))) == []


@pytest.mark.parametrize('twin', TWINS, ids=IDS)
def test_step_all_reduces_the_gradients_once_and_gathers_nothing(twin, mnist_batches):
    found = compiled_step_collectives(twin, mnist_batches)
    assert found, 'a data-parallel step must hold at least one all-reduce'
    assert {c.kind for c in found} == {'all-reduce'}, found  # no all-gather of the params
    assert sum(c.bytes for c in found) == param_bytes() + METRIC_BYTES
    for c in found:
        assert set(c.dtypes) == {'f32'}
        assert c.group_size == 8, c.replica_groups  # one group: every device of the mesh


def test_twins_reduce_the_same_arrays(mnist_batches):
    shapes = {}
    for twin in TWINS:
        found = compiled_step_collectives(twin, mnist_batches)
        # auto may lay a weight gradient out transposed ([out, in]): compare element counts.
        shapes[twin] = sorted(int(np.prod(s)) for c in found for s in c.shapes)
    assert shapes[auto] == shapes[explicit] == shapes[typed]


@pytest.mark.pinned
def test_inspector_pins_the_mlp_collectives():
    r = inspect_collectives('mlp')
    grads = r['expected']['gradient_bytes']
    assert grads == 669_706 * 4 and r['expected']['ring_bytes_per_device'] == 2 * 7 / 8 * grads
    assert r['programs']['one_device'] == []
    for twin in ('auto', 'explicit', 'typed'):
        (op,) = r['programs'][twin]  # exactly one, combined all-reduce
        assert op['kind'] == 'all-reduce' and op['group_size'] == 8
        assert op['bytes'] == grads + 8  # + the mean loss and accuracy
    assert r['differences'] == [] and r['typed_differences'] == []


@pytest.mark.slow  # four transformer programs (5 s at the suite's level 0): the MLP's run fast
@pytest.mark.pinned
def test_inspector_pins_the_transformer_collectives():
    """Pinned compiler behaviour (jax 0.10.2 and 0.12): the tied embedding gets two gradient terms, the
    lookup and the output head. explicit/ adds them on each device and all-reduces the sum once;
    auto/ all-reduces each term, moving one extra [256, 128] float32 (131,072 bytes). typed/'s
    `reduced` table gets one `unreduced` gradient, both terms summed before its one reduction.
    The blocks are stacked ([L, ...] arrays, L = 4): explicit/ all-reduces each stacked gradient
    once; auto/ all-reduces each layer's slice where it is formed, L ops of 1/L the size, and so
    does typed/ for the LayerNorm scales ([L, C]: vectors of each layer, not `reduced`, so their
    gradients are summed where they are formed), in the same bytes as explicit/."""
    r = inspect_collectives('transformer', batch_size=16)
    grads = r['expected']['gradient_bytes']
    assert grads == 828_544 * 4
    twins = ('auto', 'explicit', 'typed')
    sizes = {twin: sum(op['bytes'] for op in r['programs'][twin]) for twin in twins}
    assert sizes['explicit'] == sizes['typed'] == grads + 4  # + the mean loss
    assert sizes['auto'] == grads + 4 + 256 * 128 * 4
    assert r['differences'] == [
        'auto has all-reduce of 32,768 elements over 8 devices that explicit lacks (x5)',
        'auto has all-reduce of 128 elements over 8 devices that explicit lacks (x8)',
        'auto has all-reduce of 65,536 elements over 8 devices that explicit lacks (x6)',
        'auto has all-reduce of 16,384 elements over 8 devices that explicit lacks (x8)',
        'explicit has all-reduce of 512 elements over 8 devices that auto lacks (x2)',
        'explicit has all-reduce of 262,144 elements over 8 devices that auto lacks (x2)',
        'explicit has all-reduce of 131,072 elements over 8 devices that auto lacks (x1)',
    ]
    assert r['typed_differences'] == [
        'typed has all-reduce of 128 elements over 8 devices that explicit lacks (x8)',
        'explicit has all-reduce of 512 elements over 8 devices that typed lacks (x2)',
    ]
    for twin in twins:
        assert {op['kind'] for op in r['programs'][twin]} == {'all-reduce'}


@pytest.mark.slow
def test_inspector_cli_prints_the_same_json():
    """The CLI (its flags, --json) over the same function the tests above call in process."""
    result = subprocess.run(
        [sys.executable, '-m', 'inspector', '--json', '--cpu_devices=8'],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == inspect_collectives('mlp')
