"""Claim: FSDP (--strategy=fsdp) keeps 1/n of the parameters and optimizer state per device,
and trains exactly like data parallelism and the one-device run, in both twins and for both
models. The explicit twin moves its weights with all-gathers and its gradients with
reduce-scatters, written out. (Checkpoints moving between strategies: test_tp.py.)"""

import jax
import numpy as np
import pytest

from auto import fsdp as auto_fsdp
from auto import train_step as auto
from explicit import fsdp as explicit_fsdp
from parity_tests.conftest import CLI_MODELS, fresh_state
from parity_tests.hlo import collectives, compiled_text
from parity_tests.test_cli import read_metrics, run_cli
from parity_tests.test_gradient_parity import TOL, assert_trees_close, twin_loss_and_grads
from parity_tests.test_training_parity import LOSS_TOL, PARAM_TOL, train, train_twin
from shard_parity.step import reference_loss_and_grads, reference_train_step
from shard_parity.tasks import classification_loss

TWINS = [auto_fsdp, explicit_fsdp]
IDS = ['auto', 'explicit']


def device0_bytes(state):
    """Bytes of the state held by the first device: what FSDP divides."""
    d0 = jax.devices()[0]
    return sum(
        s.data.nbytes
        for x in jax.tree.leaves(state)
        for s in x.addressable_shards
        if s.device == d0
    )


@pytest.mark.parametrize('twin', TWINS, ids=IDS)
def test_state_per_device_falls_to_one_nth(twin, mesh8, case):
    _, _, state = fresh_state(case=case)
    replicated = device0_bytes(auto.place_state(jax.tree.map(np.array, state), mesh8))
    sharded = device0_bytes(twin.place_state(jax.tree.map(np.array, state), mesh8))
    small = sum(x.nbytes for x in jax.tree.leaves(state) if x.ndim == 0 or x.shape[0] % 8)
    assert replicated == sum(x.nbytes for x in jax.tree.leaves(state))
    assert sharded == (replicated - small) / 8 + small  # every divisible array split 8 ways
    assert sharded < replicated / 7


@pytest.mark.parametrize('twin', TWINS, ids=IDS)
def test_fsdp_gradients_match_the_one_device_reference(twin, mesh8, case):
    graphdef, _, state = fresh_state(case=case)
    batch = case.batches.batch(0)
    ref_metrics, ref_grads = reference_loss_and_grads(graphdef, case.loss_fn)(state.params, batch)
    metrics, grads = twin_loss_and_grads(twin, mesh8, graphdef, case.loss_fn, state, batch)
    np.testing.assert_allclose(metrics['loss'], ref_metrics['loss'], **TOL)
    assert_trees_close(grads, ref_grads, **TOL)
    kernels = [g for g in jax.tree.leaves(grads) if g.ndim == 2]
    assert all(not g.sharding.is_fully_replicated for g in kernels)  # they stay sharded


def test_fsdp_trains_like_the_one_device_run(mesh8, case):
    graphdef, tx, state = fresh_state(case=case)
    ref_losses, ref_params = train(
        reference_train_step(graphdef, case.loss_fn, tx), state, case.batches
    )
    runs = [train_twin(twin, mesh8, case) for twin in TWINS]
    for losses, params in runs:
        np.testing.assert_allclose(losses, ref_losses, **LOSS_TOL)
        for p, r in zip(params, ref_params, strict=True):
            np.testing.assert_allclose(p, r, **PARAM_TOL)
    assert not np.allclose(ref_losses, ref_losses[::-1])  # the run moved: the test can fail


def test_explicit_fsdp_gathers_weights_and_scatters_gradients(mesh8, mnist_batches):
    graphdef, tx, state = fresh_state()
    step = explicit_fsdp.train_step(graphdef, classification_loss, tx, mesh8)
    placed = explicit_fsdp.place_state(state, mesh8)
    found = collectives(
        compiled_text(step, placed, explicit_fsdp.place_batch(mnist_batches.batch(0), mesh8))
    )
    by_kind = {}
    for c in found:
        by_kind[c.kind] = by_kind.get(c.kind, 0) + c.bytes
    weights = sum(p.nbytes for p in jax.tree.leaves(state.params) if p.shape[0] % 8 == 0)
    assert set(by_kind) == {'all-gather', 'reduce-scatter', 'all-reduce'}
    assert by_kind['all-gather'] == weights  # each sharded weight gathered once, whole
    assert by_kind['reduce-scatter'] == weights // 8  # each device keeps 1/8 of the gradient
    assert by_kind['all-reduce'] == 10 * 4 + 8  # the odd-sized bias (10 classes) + 2 metrics


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
