"""Claim: training resumes without a trace. 40 steps straight and 20 + 20 steps in the same
workdir give identical parameters and identical logged losses, for both models and both twins;
a save killed half-way is never mistaken for a checkpoint; checkpoints restore onto any device
count; other settings, corrupt checkpoints and a diverging loss are refused clearly."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from parity_tests.helpers import (
    CLI_MODELS,
    REPO,
    fresh_state,
    logits,
    make_case,
    plan_of,
    read_metrics,
    run_cli,
    save_checkpoint,
)
from shard_parity.mesh import make_mesh
from shard_parity.placement import place_state
from shard_parity.runtime import checkpoint

MODELS = CLI_MODELS
COMMON = [
    '--cpu_devices=8',
    '--decay_steps=40',
    '--log_every=5',
    '--eval_every=10',
    '--checkpoint_every=10',
]


def losses(workdir):
    """Every logged figure except the measured throughput."""
    return [
        {k: v for k, v in line.items() if not k.endswith('_per_sec')}
        for line in read_metrics(workdir)
    ]


def params(workdir):
    _, _, state = checkpoint.restore(workdir, make_mesh(1))
    return [np.asarray(p) for p in jax.tree.leaves(state.params)]


@pytest.mark.slow
@pytest.mark.parametrize('model', MODELS)
# the loop and the checkpoint are shared: auto's runs add coverage, not signal (exhaustive tier)
@pytest.mark.parametrize('twin', [pytest.param('auto', marks=pytest.mark.exhaustive), 'explicit'])
def test_resumed_run_equals_the_straight_run(twin, model, tmp_path):
    flags = [*MODELS[model], *COMMON]
    straight, split = tmp_path / 'straight', tmp_path / 'split'
    assert run_cli(twin, *flags, '--steps=40', f'--workdir={straight}').returncode == 0
    first = run_cli(twin, *flags, '--steps=20', f'--workdir={split}')
    assert first.returncode == 0, first.stderr[-2000:]
    assert (split / 'checkpoints' / '20').is_dir() and read_metrics(split)[-1]['step'] == 20
    second = run_cli(twin, *flags, '--steps=40', f'--workdir={split}')
    assert second.returncode == 0, second.stderr[-2000:]
    assert 'resuming from' in second.stderr
    assert losses(split) == losses(straight)
    for a, b in zip(params(split), params(straight), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_run_killed_mid_save_resumes_from_the_last_complete_checkpoint(tmp_path):
    flags = [*MODELS['mlp'], *COMMON, '--checkpoint_every=3', f'--workdir={tmp_path / "run"}']
    proc = subprocess.Popen(
        [sys.executable, '-m', 'auto.train', *flags, '--steps=400'],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    folder = tmp_path / 'run' / 'checkpoints'
    deadline = time.time() + 120

    def saving_after_a_complete_one():
        names = [p.name for p in _ls(folder)]
        return any(n.isdigit() for n in names) and any('tmp' in n for n in names)

    while time.time() < deadline and not saving_after_a_complete_one():
        time.sleep(0.002)  # wait until Orbax is writing a checkpoint after a complete one ...
    os.kill(proc.pid, signal.SIGKILL)  # ... and kill it there
    proc.wait()
    partial = [p.name for p in _ls(folder) if not p.name.isdigit()]
    complete = sorted(int(p.name) for p in _ls(folder) if p.name.isdigit())
    assert complete, 'the kill came before the first complete checkpoint'
    # A leftover partial folder, as a kill during a save leaves, must be ignored as well:
    (folder / f'{complete[-1] + 3}.orbax-checkpoint-tmp-1').mkdir(exist_ok=True)
    result = run_cli('auto', *flags, '--steps=60')
    assert result.returncode == 0, result.stderr[-2000:]
    assert f'resuming from {folder / str(complete[-1])}' in result.stderr, (partial, complete)
    assert read_metrics(tmp_path / 'run')[-1]['step'] == 60


def _ls(folder):
    return list(folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize('save_n, restore_n', [(8, 1), (8, 2), (8, 4), (1, 8), (2, 8)])
def test_checkpoint_restores_on_another_device_count(save_n, restore_n, tmp_path):
    case = make_case('transformer')
    graphdef, _, state = fresh_state(case=case)
    state = place_state(state, make_mesh(save_n), plan_of(make_mesh(save_n), 'dp'))
    save_checkpoint(tmp_path, state, case)
    tokens = case.batches.batch(0)['x']
    before = logits(graphdef, state.params, tokens)
    _, graphdef2, restored = checkpoint.restore(tmp_path, make_mesh(restore_n))
    assert len(jax.tree.leaves(restored.params)[0].sharding.device_set) == restore_n
    np.testing.assert_array_equal(logits(graphdef2, restored.params, tokens), before)


@pytest.mark.slow
def test_other_model_settings_are_refused_naming_the_fields(tmp_path):
    flags = [*MODELS['transformer'], *COMMON, f'--workdir={tmp_path}']
    assert run_cli('explicit', *flags, '--steps=10').returncode == 0
    result = run_cli('explicit', *flags, '--steps=20', '--embed_dim=32', '--num_layers=2')
    assert result.returncode != 0
    assert '--embed_dim: checkpoint 16, requested 32' in result.stderr
    assert '--num_layers: checkpoint 1, requested 2' in result.stderr
    assert 'Traceback' not in result.stderr


@pytest.mark.slow
def test_corrupt_checkpoint_is_reported_and_older_ones_stay(tmp_path):
    flags = [*MODELS['mlp'], *COMMON, f'--workdir={tmp_path}']
    assert run_cli('auto', *flags, '--steps=20').returncode == 0
    newest = tmp_path / 'checkpoints' / '20'
    for f in (newest / 'state').rglob('*'):
        if f.is_file() and f.stat().st_size > 100:
            f.write_bytes(f.read_bytes()[:50])  # truncate every data file of the newest
    result = run_cli('auto', *flags, '--steps=30')
    assert result.returncode != 0 and 'Traceback' not in result.stderr
    assert f'checkpoint {newest} is corrupt or truncated' in result.stderr
    assert 'intact older checkpoints: [10]' in result.stderr
    shutil.move(newest, tmp_path / 'bad-20')  # as the message says: move it aside
    result = run_cli('auto', *flags, '--steps=30')
    assert result.returncode == 0 and 'resuming from' in result.stderr


@pytest.mark.slow
def test_a_diverging_loss_stops_without_saving_nan(tmp_path):
    flags = [*MODELS['mlp'], *COMMON, '--learning_rate=1e12', f'--workdir={tmp_path}']
    result = run_cli('explicit', *flags, '--steps=30')
    assert result.returncode != 0 and 'Traceback' not in result.stderr
    assert 'training stopped' in result.stderr and 'at step' in result.stderr
    for step in checkpoint.reader(tmp_path).all_steps():
        _, _, state = checkpoint.restore(tmp_path, make_mesh(1), step=step)
        assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(state.params))


@pytest.mark.slow
def test_config_json_matches_the_checkpoint(tmp_path):
    flags = [*MODELS['mlp'], *COMMON, '--steps=10', f'--workdir={tmp_path}']
    assert run_cli('auto', *flags).returncode == 0
    saved = json.loads((tmp_path / 'config.json').read_text())
    with checkpoint.reader(tmp_path) as mngr:
        assert checkpoint.read_config(mngr, 10) == saved
