"""Claim: a resumed run logs what an undisturbed run logs. Every line of metrics.jsonl (less the
measured throughput) of a run stopped and resumed is bitwise the undisturbed run's, wherever the
stop falls: on the first step, mid-window, on a window boundary, just before an evaluation or a
checkpoint, on a periodic checkpoint, or a kill -9 after one; alone, and under the launcher with 2
processes on a composed mesh and under 1F1B. Each checkpoint carries the averaging window
(shard_parity/runtime/loop.py). A checkpoint saved before it did still resumes: its first train
line says how many steps it averages, and compare and bisect pair like with like."""

import dataclasses
import json
import shutil
import subprocess
import sys

import pytest

from parity_tests.helpers import CLI_MODELS, REPO, TINY_TRANSFORMER, make_case, plan_of, run_cli
from shard_parity import auto
from shard_parity.runtime import checkpoint, integrity, loop, tasks
from shard_parity.runtime.training import Outputs, run

# log every 5 steps, evaluate every 8, save every 6: stops fall on and off each grid
GRID = dict(log_every=5, eval_every=8, log_grad_norm=True)


def lines(workdir):
    """Every metrics line, less the measured throughput (wall-clock)."""
    text = (workdir / 'metrics.jsonl').read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if not k.endswith('_per_sec')} for x in text]


def train(workdir, mesh, steps, monkeypatch=None, stop=None, grad_norm=True):
    """The tiny transformer's run() in this process, stopped after step `stop` as a SIGTERM
    there would stop it (the loop's stop_requested says yes): the loop saves and raises."""
    case = make_case('transformer')
    config = dataclasses.replace(case.config, steps=steps, batch_size=16, **GRID)
    config = dataclasses.replace(config, log_grad_norm=grad_norm)
    task = tasks.shakespeare_task(config, TINY_TRANSFORMER)
    task = dataclasses.replace(task, eval_batches=task.eval_batches[:2])  # a quicker evaluation
    args = (auto, plan_of(mesh, 'dp'), task, config, workdir, Outputs(checkpoint_every=6))
    if stop is None:
        return run(*args)
    with monkeypatch.context() as m:
        m.setattr(loop, 'stop_requested', lambda step: step == stop)
        with pytest.raises(loop.Interrupted, match=f'interrupted at step {stop}; saved'):
            run(*args)


def as_saved_before_windows(workdir, step):
    """Checkpoint `step` as a run before this change saved it: no averaging window."""
    folder = workdir / 'checkpoints' / str(step)
    shutil.rmtree(folder / 'window')
    (folder / integrity.CHECKSUMS).unlink()
    integrity.write_checksums(folder)


def stopped_at_7(mesh, tmp_path, monkeypatch, grad_norm=True):
    """(an undisturbed run of 10 steps, one stopped after step 7: mid-window, just before the
    evaluation at 8)."""
    straight, split = tmp_path / 'straight', tmp_path / 'split'
    train(straight, mesh, 10, grad_norm=grad_norm)
    train(split, mesh, 10, monkeypatch, stop=7, grad_norm=grad_norm)
    return straight, split


def test_a_run_stopped_mid_window_logs_what_the_undisturbed_run_logs(mesh8, tmp_path, monkeypatch):
    """The window of steps 6 and 7 is saved with checkpoint 7, and the resumed line at 10
    averages 6..10 as the undisturbed run's does (without the window it does not: the next
    test). The fast tier's case: no gradient norm, the program test_faults.py compiles."""
    straight, split = stopped_at_7(mesh8, tmp_path, monkeypatch, grad_norm=False)
    saved = checkpoint.read_window(checkpoint.reader(split), 7)
    assert saved['step'] == 7 and len(saved['values']) == 2  # steps 6 and 7
    train(split, mesh8, 10, grad_norm=False)
    assert lines(split) == lines(straight)


@pytest.mark.slow
def test_a_checkpoint_without_its_window_resumes_and_says_so(mesh8, tmp_path, monkeypatch):
    """Checkpoint 7 as saved before checkpoints kept the window: the resumed line at 10 averages
    8..10 and says so (3 steps); compare's and bisect's pairing leave it out, and the runs
    agree everywhere else."""
    from shard_parity.tools.bisect import runs
    from shard_parity.tools.compare import pairing

    straight, old = stopped_at_7(mesh8, tmp_path, monkeypatch)
    as_saved_before_windows(old, 7)
    train(old, mesh8, 10)
    differ = [(a, b) for a, b in zip(lines(old), lines(straight), strict=True) if a != b]
    assert [(a['step'], a.get('train_steps_averaged')) for a, _ in differ] == [(10, 3)]
    assert differ[0][0]['train_loss'] != differ[0][1]['train_loss']  # the comparison can fail
    assert pairing.window_starts(lines(old))[10] == 7
    assert pairing.window_starts(lines(straight))[10] == 5
    read = [runs.read_run(str(w))[1] for w in (straight, old)]
    assert runs.first_difference(*read, 'bitwise') == (None, 10, [10])  # like meets like only
    assert 'average over different steps' in runs.window_notes([10])[0]  # what bisect says


@pytest.mark.slow
@pytest.mark.parametrize('stop', [1, 10, 11, 12, 15])
def test_wherever_the_stop_falls_the_log_is_the_undisturbed_runs(
    stop, mesh8, tmp_path, monkeypatch
):
    """1: the first step; 10: a window boundary; 11: just before the checkpoint at 12; 12: on a
    periodic checkpoint, mid-window (that save keeps the window); 15: a boundary just before
    the evaluation at 16. A run stopped before 13 is stopped again there: twice in one run."""
    straight, split = tmp_path / 'straight', tmp_path / 'split'
    train(straight, mesh8, 20)
    train(split, mesh8, 20, monkeypatch, stop=stop)
    if stop < 13:
        train(split, mesh8, 20, monkeypatch, stop=13)  # a second stop in the same run
    train(split, mesh8, 20)
    assert lines(split) == lines(straight)


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, '-m', *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


TINY = [*CLI_MODELS['transformer'], '--log_every=5', '--eval_every=8', '--log_grad_norm']
TINY += ['--steps=20', '--decay_steps=40']


@pytest.mark.slow
def test_a_kill_after_a_periodic_checkpoint_off_the_log_grid_resumes_into_the_same_window(tmp_path):
    """--checkpoint_every=3, --log_every=5: a kill -9 after step 14 resumes from checkpoint 12,
    whose window (steps 11, 12) the line at 15 needs."""
    flags = [*TINY, '--cpu_devices=8', '--mesh=data:2,fsdp:2,model:2', '--checkpoint_every=3']
    straight, split = tmp_path / 'straight', tmp_path / 'split'
    assert run_cli('explicit', *flags, f'--workdir={straight}').returncode == 0
    killed = cli(
        'parity_tests.stop_at', 'kill@14@0', 'explicit.train', *flags, f'--workdir={split}'
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = run_cli('explicit', *flags, f'--workdir={split}')
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f'resuming from {split / "checkpoints" / "12"}' in resumed.stderr
    assert lines(split) == lines(straight)


def launch(*command, grace=120):
    return cli('tools.launch', '--num_processes=2', '--cpu_devices_per_process=4',
               f'--grace_seconds={grace}', '--', sys.executable, '-m', *command)  # fmt: skip


@pytest.mark.slow  # ~36 s
@pytest.mark.exhaustive  # the suite's time (2026-12-05): one process's mid-window stop stays
def test_two_processes_on_a_composed_mesh_stopped_mid_window_log_what_they_would_have(tmp_path):
    flags = [*TINY, '--mesh=data:2,fsdp:2,model:2', '--checkpoint_every=6']
    straight, split = tmp_path / 'straight', tmp_path / 'split'
    calm = launch('explicit.train', *flags, f'--workdir={straight}')
    assert calm.returncode == 0, calm.stderr[-3000:]
    stopped = launch('parity_tests.stop_at', '7', 'explicit.train', *flags, f'--workdir={split}')
    # each process exits 143, as a scheduler's SIGTERM to each would make it, and so does the
    # launcher, its processes agreeing; process 0 says where they stopped
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert 'interrupted at step 7; saved checkpoint 7' in stopped.stderr, stopped.stderr[-3000:]
    resumed = launch('explicit.train', *flags, f'--workdir={split}')
    assert resumed.returncode == 0 and 'resuming from' in resumed.stderr, resumed.stderr[-3000:]
    assert lines(split) == lines(straight)


@pytest.mark.slow
@pytest.mark.exhaustive  # about 55 s: a resume's log under GPipe is the suite's (the tests above)
def test_under_1f1b_a_killed_process_resumes_to_the_undisturbed_log(tmp_path):
    """Two processes under --pp_schedule=1f1b; process 1 is killed (-9) after step 14, past the
    periodic checkpoint 12; the launcher stops process 0; the rerun resumes from 12 and logs what
    the undisturbed run logs."""
    flags = [*TINY, '--strategy=pp', '--pp_schedule=1f1b', '--mesh=4x2', '--num_layers=2']
    flags += ['--checkpoint_every=3']
    straight, split = tmp_path / 'straight', tmp_path / 'split'
    calm = launch('explicit.train', *flags, f'--workdir={straight}')
    assert calm.returncode == 0, calm.stderr[-3000:]
    killed = launch('parity_tests.stop_at', 'kill@14@1', 'explicit.train', *flags,
                    f'--workdir={split}', grace=5)  # fmt: skip
    assert killed.returncode != 0 and 'process 1 was killed by SIGKILL' in killed.stderr
    resumed = launch('explicit.train', *flags, f'--workdir={split}')
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f'resuming from {split / "checkpoints" / "12"}' in resumed.stderr
    assert lines(split) == lines(straight)
