"""Claim: FSDP (--strategy=fsdp) keeps 1/n of the parameters and optimizer state per device,
and trains exactly like data parallelism and the one-device run, in all three twins and for
both models. The explicit twin moves its weights with all-gathers and its gradients with
reduce-scatters, written out; typed/'s reshards ask for the same, and XLA:CPU compiles its
reduce-scatter as an all-reduce and a slice. (Checkpoints moving between strategies:
test_tp.py.)"""

import jax
import numpy as np
import pytest

from parity_tests.helpers import (
    CLI_MODELS,
    LOSS_TOL,
    TOL,
    X64_TOL,
    assert_close,
    assert_params_close,
    assert_trees_close,
    device0_bytes,
    fresh_state,
    plan_of,
    read_metrics,
    run_cli,
    strategy_mesh,
    train_twin,
    twin_loss_and_grads,
)
from parity_tests.wide import one_device_runs, train_twin_x64
from shard_parity import auto, explicit, typed
from shard_parity.inspector.hlo import collectives, compiled_text
from shard_parity.placement import layer_dims, place_batch, place_state
from shard_parity.runtime.tasks import classification_loss
from shard_parity.step import one_device_loss_and_grads

TWINS = [auto, explicit, typed]
IDS = ['auto', 'explicit', 'typed']


def fsdp_mesh(twin):
    """--strategy=fsdp's mesh on 8 devices for `twin` (typed's axes are Explicit)."""
    return strategy_mesh('fsdp', twin=twin)


def test_state_per_device_falls_to_one_nth(fsdp8, case):
    _, _, state = fresh_state(case=case)
    replicated = device0_bytes(place_state(jax.tree.map(np.array, state), fsdp8, plan_of(fsdp8, 'dp')))
    sharded = device0_bytes(place_state(jax.tree.map(np.array, state), fsdp8, plan_of(fsdp8, 'fsdp')))
    # arrays with no dimension 8 divides (a stacked array's layer dimension is never split)
    leaves = jax.tree_util.tree_leaves_with_path(state)
    small = sum(x.nbytes for p, x in leaves if all(d % 8 for d in x.shape[layer_dims(p) :]))
    assert replicated == sum(x.nbytes for x in jax.tree.leaves(state))
    assert sharded == (replicated - small) / 8 + small  # every divisible array split 8 ways
    assert sharded < replicated / 7


@pytest.mark.parametrize('twin', TWINS, ids=IDS)
def test_fsdp_gradients_match_the_one_device_run(twin, case):
    graphdef, _, state = fresh_state(case=case)
    batch = case.batches.batch(0)
    want_metrics, want_grads = one_device_loss_and_grads(graphdef, case.loss_fn)(
        state.params, batch
    )
    mesh = fsdp_mesh(twin)
    metrics, grads = twin_loss_and_grads(twin, mesh, graphdef, case.loss_fn, state, batch, 'fsdp')
    assert_close(metrics['loss'], want_metrics['loss'], 'loss', **TOL)
    assert_trees_close(grads, want_grads, **TOL)
    kernels = [g for g in jax.tree.leaves(grads) if g.ndim == 2]
    assert all(not g.sharding.is_fully_replicated for g in kernels)  # they stay sharded


# In the full suite (the MLP 18 s of CPU, the transformer 36 s); test_mesh_parity trains both
# models under fsdp on 2x4 in the fast tier.
@pytest.mark.slow
@pytest.mark.parametrize('case', ['mlp', 'transformer'], indirect=True)
def test_fsdp_trains_like_the_one_device_run(case):
    """float32: the loss at every step; float64: every loss and parameter (helpers.py)."""
    (want_losses, _), (want_losses_64, want_params_64) = one_device_runs(case)
    assert not np.allclose(want_losses, want_losses[::-1])  # the run moved: the test can fail
    for twin in TWINS:
        losses, _ = train_twin(twin, fsdp_mesh(twin), case, strategy='fsdp')
        assert_close(losses, want_losses, 'float32 losses', **LOSS_TOL)
        losses, params = train_twin_x64(twin, fsdp_mesh(twin), case, strategy='fsdp')
        assert_close(losses, want_losses_64, 'float64 losses', **X64_TOL)
        assert_params_close(params, want_params_64, **X64_TOL)


def fsdp_step_bytes(twin, mnist_batches):
    """(bytes moved by each kind of collective in `twin`'s compiled fsdp step of the MLP,
    the bytes of its weights that fsdp splits, of all its parameters)."""
    mesh = fsdp_mesh(twin)
    graphdef, tx, state = fresh_state()
    step = twin.fsdp.train_step(graphdef, classification_loss, tx, mesh, plan_of(mesh, 'fsdp'))
    placed = place_state(state, mesh, plan_of(mesh, 'fsdp'))
    found = collectives(compiled_text(step, placed, place_batch(mnist_batches.batch(0), mesh, plan_of(mesh, 'fsdp'))))
    by_kind = {}
    for c in found:
        by_kind[c.kind] = by_kind.get(c.kind, 0) + c.bytes
    params = jax.tree.leaves(state.params)
    weights = sum(p.nbytes for p in params if p.shape[0] % 8 == 0)
    return by_kind, weights, sum(p.nbytes for p in params)


def test_explicit_fsdp_gathers_weights_and_scatters_gradients(mnist_batches):
    by_kind, weights, _ = fsdp_step_bytes(explicit, mnist_batches)
    assert set(by_kind) == {'all-gather', 'reduce-scatter', 'all-reduce'}
    assert by_kind['all-gather'] == weights  # each sharded weight gathered once, whole
    assert by_kind['reduce-scatter'] == weights // 8  # each device keeps 1/8 of the gradient
    assert by_kind['all-reduce'] == 10 * 4 + 8  # the odd-sized bias (10 classes) + 2 metrics


def test_typed_fsdp_gathers_weights_and_all_reduces_gradients(mnist_batches):
    """typed/fsdp.py's two reshards: split weights -> whole `reduced` (the all-gathers, as
    explicit/'s), `unreduced` gradients -> split (a reduce-scatter in the types). XLA:CPU has no
    pass forming reduce-scatters, so the second compiles to one all-reduce of every gradient and
    a slice (docs/typed.md; jax 0.10.2 and 0.12), as auto/'s does."""
    by_kind, weights, params = fsdp_step_bytes(typed, mnist_batches)
    assert set(by_kind) == {'all-gather', 'all-reduce'}
    assert by_kind['all-gather'] == weights  # each sharded weight gathered once, whole
    assert by_kind['all-reduce'] == params + 8  # every gradient once, + the 2 metrics


@pytest.mark.slow
def test_cli_trains_with_fsdp_and_resumes_under_dp(tmp_path):
    flags = [
        *CLI_MODELS['transformer'],
        '--cpu_devices=8',
        '--decay_steps=20',
        '--log_every=5',
        '--eval_every=10',
        f'--workdir={tmp_path}',
    ]
    first = run_cli('explicit', *flags, '--strategy=fsdp', '--steps=10')
    assert first.returncode == 0, first.stderr[-2000:]
    second = run_cli('auto', *flags, '--strategy=dp', '--steps=20')
    assert second.returncode == 0, second.stderr[-2000:]
    assert 'resuming from' in second.stderr
    lines = read_metrics(tmp_path)
    assert lines[-1]['final'] and lines[-1]['step'] == 20
    assert [line['step'] for line in lines if 'train_loss' in line] == [5, 10, 15, 20]
