"""Claim: `python -m tools.bisect --from=WORKDIR[@STEP]` starts both sides from a train run's
checkpoint: its parameters, AdamW's state and step, on the batches the run takes next, with the
checkpoint's model (docs/bisect.md). From a trained state correct twins agree and the zoo's
dp_psum is still caught at the checkpoint's step; with two run directories --from=RUN@STEP picks
the checkpoint the replay starts from. Bad input is one line and exit 2: a folder without a
checkpoint, a step that was not saved (naming those that were), flags of another model (naming
the fields), a STEP that is not a number."""

import dataclasses
import json
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from absl import flags

from parity_tests.helpers import (
    REPO,
    TINY_TRANSFORMER,
    fresh_state,
    make_case,
    plan_of,
    save_checkpoint,
)
from shard_parity import UsageError, auto, exit_status
from shard_parity import config as cfg
from shard_parity.runtime import checkpoint, tasks
from shard_parity.runtime.training import Outputs, run
from shard_parity.tools.bisect import runs
from shard_parity.tools.bisect import divergence as D

STEPS = 6  # the run trains 6 steps of the MLP, saving at 2, 4 and 6
cli = None  # tools/bisect/cli.py, imported for this module's tests alone (`_bisect_cli`)


@pytest.fixture(autouse=True, scope='module')
def _bisect_cli():
    """tools/bisect/cli.py, driven through its absl flags in this process, for this module's
    tests alone: CLIs that other modules test in-process define some of the same names (the
    inspector's --json), so its flags and the module go when this module's last test ends."""
    global cli
    from shard_parity.tools.bisect import cli as module

    cli = module
    yield
    for flag in flags.FLAGS.get_flags_for_module(module.__name__):
        delattr(flags.FLAGS, flag.name)
    sys.modules.pop(module.__name__, None)
    cli = None


@pytest.fixture(scope='module')
def trained(tmp_path_factory, mesh8):
    """A workdir of auto's dp run of the MLP (batch 64) on 8 devices, in this process."""
    workdir = tmp_path_factory.mktemp('trained')
    config = dataclasses.replace(
        cfg.TRAIN_DEFAULTS['mlp'], steps=STEPS, batch_size=64, log_every=1, eval_every=STEPS
    )
    task = tasks.mnist_task(config)
    run(auto, plan_of(mesh8, 'dp'), task, config, workdir, Outputs(checkpoint_every=2))
    assert checkpoint.steps(workdir) == [2, 4, 6]
    return workdir


def bisect(*argv, call=lambda: cli.from_flags()):
    """The bisect CLI's from_flags() (or `call`) on `argv`, in this process (the flags back to
    their defaults after: --from sets the model's flags to the checkpoint's)."""
    flags.FLAGS.unparse_flags()
    try:
        flags.FLAGS(['bisect', *argv])
        return call()
    finally:
        flags.FLAGS.unparse_flags()
        flags.FLAGS(['bisect'])


def test_twins_start_from_the_trained_state_on_the_runs_next_batches(trained, monkeypatch):
    """The state the bisector starts from is checkpoint 4's, not the seed's (they differ); its
    step 4 is the first compared, on batch 4: auto's own step from it on batches 4 and 5 lands
    on checkpoint 6 exactly. auto and explicit agree from there in float32."""
    seen = {}
    real = D.bisect

    def spy(a, b, graphdef, loss_fn, tx, state, batches, steps, tolerance, start=0):
        seen.update(a=a, graphdef=graphdef, loss_fn=loss_fn, tx=tx, state=state, start=start)
        seen['batches'] = batches
        return real(a, b, graphdef, loss_fn, tx, state, batches, steps, tolerance, start=start)

    monkeypatch.setattr(D, 'bisect', spy)
    report = bisect('--twins=auto,explicit', f'--from={trained}@4', '--steps=2')
    assert not report.diverged and report.steps == 2 and report.tolerance == 'f32'
    assert f'checkpoint 4 of {trained}' in report.notes[0]
    assert 'the first step compared is step 4' in report.notes[0]
    _, _, saved4 = checkpoint.read_numpy(trained, 4)
    _, _, saved6 = checkpoint.read_numpy(trained, 6)
    state, begun = seen['state'], dict(seen)
    assert seen['start'] == 4 and int(state.step) == 4
    for x, y in zip(jax.tree.leaves(state), jax.tree.leaves(saved4), strict=True):
        np.testing.assert_array_equal(x, y)
    # without --from the bisector starts from the seed's state: every parameter differs
    fresh = bisect('--batch_size=64', call=cli.started).state
    assert int(fresh.step) == 0
    initial = jax.tree.leaves(fresh.params)
    moved = [np.abs(x - y).max() for x, y in zip(initial, jax.tree.leaves(state.params))]
    assert min(moved) > 1e-4, moved
    # auto's own step from that state on the bisector's batches 4, 5: the run's checkpoint 6
    runner = D.Runner(begun['a'], begun['graphdef'], begun['loss_fn'], begun['tx'])
    after = state
    for i in (4, 5):
        after, _ = runner.train_step(after, begun['batches'].batch(i))
    assert int(after.step) == 6
    for x, y in zip(jax.tree.leaves(after), jax.tree.leaves(saved6), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_the_zoo_is_still_caught_from_a_checkpoint(trained):
    """dp_psum (explicit/dp.py summing the gradient where it means it) diverges at the
    checkpoint's step, in the gradients, 8x: the data axis."""
    report = bisect(
        '--twins=explicit,tools.zoo.dp_psum', '--strategy=dp', f'--from={trained}', '--steps=2'
    )
    assert (report.step, report.phase, report.ratio) == (STEPS, 'gradients', 8.0)
    assert f'checkpoint {STEPS} of {trained}' in report.notes[0]


def test_the_model_and_its_policy_come_from_the_checkpoint(tmp_path):
    """A bf16 tiny transformer's checkpoint, with no model flag given: the bisector builds that
    transformer in bf16 (--dtype=float32 chooses float32); a shape flag that differs is
    refused, naming it. Nothing compiles."""
    case = make_case('transformer')
    shape = dataclasses.replace(TINY_TRANSFORMER, dtype='bfloat16')
    save_checkpoint(tmp_path, fresh_state(0, case)[2], case, shape)

    def started():
        return cli.started(cli.trained.read(cli.FROM.value).saved)

    start = bisect(f'--from={tmp_path}', call=started)
    assert (start.task.name, start.task.model_config) == ('transformer', shape)
    assert start.plan.precision.compute == 'bfloat16'
    start = bisect(f'--from={tmp_path}', '--dtype=float32', call=started)
    assert start.task.model_config == TINY_TRANSFORMER
    assert start.plan.precision.compute == 'float32'
    message = refused(f'--from={tmp_path}', '--num_layers=3', '--embed_dim=32')
    assert 'checkpoint 0 is of another model or training than the flags say: --num_layers: ' \
        'checkpoint 2, given 3.' in message  # fmt: skip


def refused(*argv) -> str:
    with pytest.raises(UsageError) as e:
        bisect('--twins=auto,explicit', '--steps=1', *argv)
    assert exit_status(e.value) == 2
    assert '\n' not in str(e.value)
    return str(e.value)


def test_bad_from_is_one_line(trained, tmp_path):
    assert f'--from={tmp_path}: no checkpoint in {tmp_path / "checkpoints"}; train with ' \
        f'--workdir={tmp_path} first (--checkpoint_every=N saves every N steps)' in refused(
        f'--from={tmp_path}'
    )  # fmt: skip
    assert 'step 3 was not saved; saved steps: [2, 4, 6]' in refused(f'--from={trained}@3')
    assert "'last' after @ is not a step number" in refused(f'--from={trained}@last')
    message = refused(f'--from={trained}', '--model=transformer')
    assert (
        'is of another model or training than the flags say: --model: checkpoint mlp, given '
        'transformer. --from takes them from the checkpoint: drop those flags'
    ) in message
    message = refused(f'--from={trained}@2', '--batch_size=32', '--seed=3')
    assert '--batch_size: checkpoint 64, given 32; --seed: checkpoint 0, given 3' in message


@pytest.mark.slow  # ~2.5 s on top of the trained run: each side compiles its step
def test_with_two_run_directories_from_picks_the_checkpoint_to_replay_from(trained, tmp_path):
    """A copy of the run logs what it does: with --from=RUN@2 the two are replayed from
    checkpoint 2 to their last line (4 steps), and agree; without a step, or at a step not
    saved by both, one line."""
    copy = tmp_path / 'copy'
    shutil.copytree(trained, copy)
    shutil.rmtree(copy / 'checkpoints' / '4')
    a, b = str(trained), str(copy)
    same = lambda tree: tree  # noqa: E731 (no --x64: the state as read)
    assert runs.bisect_runs(a, b, None, same, None).steps == 0  # the logs agree: no replay
    report = runs.bisect_runs(a, b, None, same, None, f'{a}@2')
    assert not report.diverged and report.steps == STEPS - 2
    assert 'replayed from checkpoint 2, as --from=' in report.notes[0]
    for begin, message in (
        (a, 'the replay starts from the newest checkpoint both hold'),
        (f'{a}@4', 'step 4 was not saved by both runs; saved steps both hold: [2, 6]'),
        (f'{tmp_path}@2', 'with two run directories --from picks the checkpoint both hold'),
    ):
        with pytest.raises(UsageError, match=re.escape(message)) as e:
            runs.bisect_runs(a, b, None, same, None, begin)
        assert exit_status(e.value) == 2


def cli_run(*argv):
    return subprocess.run(
        [sys.executable, '-m', 'tools.bisect', '--cpu_devices=8', *argv],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow  # four CLI processes: ~13 s
def test_the_cli_from_a_checkpoint_and_its_bad_inputs(trained, tmp_path):
    result = cli_run('--twins=auto,explicit', f'--from={trained}', '--steps=1', '--json')
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report['steps'] == 1 and f'checkpoint {STEPS} of {trained}' in report['notes'][0]
    for flag, message in (
        (f'--from={tmp_path}', 'no checkpoint in'),
        (f'--from={trained}@5', 'step 5 was not saved; saved steps: [2, 4, 6]'),
        (f'--from={trained}@x', "'x' after @ is not a step number"),
    ):
        result = cli_run('--twins=auto,explicit', flag)
        assert result.returncode == 2, result.stderr[-2000:]
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0] and 'Traceback' not in result.stderr
