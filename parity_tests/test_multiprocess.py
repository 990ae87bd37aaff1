"""Claim: the twins run unchanged across processes. 2 processes x 4 CPU devices (jax.distributed,
gloo over loopback, each process loading only its rows) give the losses and parameters of
1 process x 8 devices (every logged training and evaluation figure, the latter computed from the
parameters of that step), for both models of auto/ and explicit/ and for typed/'s Explicit mesh (the
MLP keeps it short); a killed process stops the run, never hangs it."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from parity_tests.helpers import CLI_MODELS, LOSS_TOL, REPO, assert_close, read_metrics, run_cli

pytestmark = pytest.mark.slow  # every test here starts several processes

FLAGS = CLI_MODELS
COMMON = ['--log_every=5', '--eval_every=5']
# gloo sums the 8 partial gradients in another order than XLA's in-process all-reduce, and
# AdamW amplifies the last bits as it does across device counts: as in test_training_parity.py,
# float32 runs are compared by their losses (and here their evaluations), never parameter by
# parameter after several steps, where the drift depends on the processor (helpers.py).
CASES = [(twin, model) for twin in ('auto', 'explicit') for model in FLAGS] + [('typed', 'mlp')]


def launch(*command, n=2, timeout=240):
    return subprocess.run(
        [
            sys.executable,
            '-m',
            'parity_tests.launch',
            f'--num_processes={n}',
            '--cpu_devices_per_process=4',
            '--',
            sys.executable,
            *command,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize('twin, model', CASES)
def test_two_processes_match_one(twin, model, tmp_path):
    flags = [*FLAGS[model], *COMMON]
    # The multi-process run stops at step 5 and resumes from its checkpoint: Orbax saves and
    # restores across processes too.
    for steps in (5, 10):
        multi = launch(
            '-m',
            f'{twin}.train',
            *flags,
            f'--steps={steps}',
            '--decay_steps=10',
            f'--workdir={tmp_path / "multi"}',
        )
        assert multi.returncode == 0, multi.stderr[-3000:]
    assert 'resuming from' in multi.stderr
    single = run_cli(
        twin,
        *flags,
        '--steps=10',
        '--decay_steps=10',
        '--cpu_devices=8',
        f'--workdir={tmp_path / "single"}',
    )
    assert single.returncode == 0, single.stderr[-3000:]
    a, b = read_metrics(tmp_path / 'multi'), read_metrics(tmp_path / 'single')
    assert [sorted(x) for x in a] == [sorted(x) for x in b]  # the same lines, from process 0 only
    for x, y in zip(a, b):
        for key in x:
            if key.startswith(('train_', 'eval_')):
                assert_close(x[key], y[key], f'{key} at {x["step"]}', **LOSS_TOL)


def test_a_killed_process_stops_the_run_in_bounded_time(tmp_path):
    command = [
        sys.executable,
        '-m',
        'parity_tests.launch',
        '--num_processes=2',
        '--cpu_devices_per_process=4',
        '--grace_seconds=30',
        '--',
        sys.executable,
        '-m',
        'explicit.train',
        *FLAGS['mlp'],
        '--steps=100000',
        '--log_every=10',
        '--heartbeat_timeout=10',
        f'--workdir={tmp_path}',
    ]
    proc = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    pids, deadline = {}, time.time() + 120
    while len(pids) < 2 and time.time() < deadline:  # the launcher names each process's pid
        line = proc.stderr.readline()
        if m := re.match(r'\[launch\] process (\d): pid (\d+)', line):
            pids[int(m.group(1))] = int(m.group(2))
    metrics = tmp_path / 'metrics.jsonl'
    while time.time() < deadline and not (metrics.exists() and metrics.read_text()):
        time.sleep(0.2)  # training is under way ...
    assert metrics.read_text(), 'the run never logged a step'
    os.kill(pids[1], signal.SIGKILL)  # ... when process 1 dies
    killed_at = time.time()
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode != 0
    assert time.time() - killed_at < 90
    assert 'process 1 was killed by SIGKILL' in rest
