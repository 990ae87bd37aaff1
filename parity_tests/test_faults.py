"""Claim: nothing is lost when people share a workdir or fill a disk. One trainer per workdir;
readers never write and survive --keep deleting under them; every save error and a torn log end
in one line, and the same command then resumes to the very parameters of an undisturbed run.
(Interrupts: test_interrupts.py.)"""

import dataclasses
import errno
import json
import os
import re
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from parity_tests.helpers import (
    FAULT_FLAGS,
    REPO,
    TINY_TRANSFORMER,
    assert_same_params,
    fresh_state,
    make_case,
    plan_of,
    run_cli,
    save_checkpoint,
)
from shard_parity import UsageError, auto
from shard_parity.mesh import make_mesh
from shard_parity.runtime import checkpoint, integrity, report, tasks
from shard_parity.runtime.training import Outputs, run

def files(workdir):
    """Every file under `workdir` with its size and modification time."""
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in workdir.rglob('*') if p.is_file()
    }


def test_a_second_trainer_is_refused_naming_the_holder(tmp_path):
    holder = rf'is in use by another trainer \(pid {os.getpid()} on '
    with report.hold_workdir(tmp_path), pytest.raises(UsageError, match=holder):
        with report.hold_workdir(tmp_path):
            pass
    with report.hold_workdir(tmp_path):  # released on exit, as the kernel does at a kill -9
        pass


def test_the_lock_survives_its_file_being_deleted_and_a_full_disk_leaves_none(tmp_path):
    """Deleting <workdir>/.lock let a second trainer in (both then wrote metrics.jsonl): the lock
    is now on the folder itself. A disk too full for the holder's name leaves no .lock."""
    with report.hold_workdir(tmp_path):
        (tmp_path / '.lock').unlink()
        with pytest.raises(UsageError, match='is in use by another trainer'):
            with report.hold_workdir(tmp_path):
                pass

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, 'No space left on device')

    new = tmp_path / 'new'
    new.mkdir()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(report.socket, 'gethostname', full)  # while the name is being written
        with pytest.raises(OSError, match=f'cannot write {new / ".lock"} \\(No space left'):
            with report.hold_workdir(new):
                pass
    assert not (new / '.lock').exists()


def test_a_reader_falls_back_when_keep_deletes_its_checkpoint(tmp_path, monkeypatch):
    case = make_case('transformer')
    _, _, state = fresh_state(case=case)
    for step in (5, 10):
        save_checkpoint(tmp_path, state._replace(step=np.int32(step)), case)
    real = checkpoint.read_config

    def deleted_while_read(mngr, step):  # the trainer's --keep removes step 10 mid-read
        if step == 10:
            shutil.rmtree(tmp_path / 'checkpoints' / '10')
        return real(mngr, step)

    monkeypatch.setattr(checkpoint, 'read_config', deleted_while_read)
    _, _, restored = checkpoint.restore(tmp_path, make_mesh(1))
    assert int(restored.step) == 5
    assert sorted(p.name for p in (tmp_path / 'checkpoints').iterdir()) == ['5']  # no cleanup


def test_a_torn_garbled_or_missing_log_never_blocks_a_resume(tmp_path, caplog):
    path = tmp_path / 'metrics.jsonl'
    good = [{'step': 5, 'train_loss': 1.0}, {'step': 10, 'eval_loss': 2.0}]
    lines = [json.dumps(r) for r in good]
    lines += ['{"step": 15, "train_lo', '{"step": 1e400}', '{"no": 1}']  # 1e400: OverflowError
    path.write_text('\n'.join(lines[:2] + lines[3:] + lines[2:3]))  # torn last line
    with caplog.at_level('WARNING'):
        report.MetricsLog(path, resume_from=10)
    assert [json.loads(line) for line in path.read_text().splitlines()] == good
    assert [r.getMessage() for r in caplog.records if 'dropped 3' in r.getMessage()]
    path.unlink()
    caplog.clear()
    with caplog.at_level('WARNING'):
        report.MetricsLog(path, resume_from=10)
    assert path.read_text() == '' and 'is missing' in caplog.text


def test_a_line_the_disk_cuts_short_is_taken_back(tmp_path, monkeypatch):
    log = report.MetricsLog(tmp_path / 'metrics.jsonl')
    log.write(step=1, loss=1.0)
    real_write = os.write

    def half_then_full(fd, data):  # the disk takes half the line, then is full
        if len(data) > 8:
            return real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, 'No space left on device')

    monkeypatch.setattr(report.os, 'write', half_then_full)
    with pytest.raises(UsageError, match='No space left on device'):
        log.write(step=2, loss=0.5)
    assert (tmp_path / 'metrics.jsonl').read_text() == '{"step": 1, "loss": 1.0}\n'


def test_a_failed_background_save_is_one_error_and_the_rerun_resumes(mesh8, tmp_path, monkeypatch):
    """Orbax writes in a background thread; a full disk there surfaced as a raw error (and
    dozens of logged tracebacks). Now: one SaveError naming the step and the intact ones."""
    case = make_case('transformer')
    config = dataclasses.replace(case.config, steps=10, eval_every=5, batch_size=16)
    task = tasks.shakespeare_task(config, TINY_TRANSFORMER)
    module = sys.modules[checkpoint.ocp.checkpointers.AsyncCheckpointer.__module__]
    real = module._background_wait_for_commit_futures

    def disk_full(directory, commit_futures, *args, **kwargs):
        if '10' in directory.name:  # the arrays are written, then the disk is full
            for f in commit_futures:
                f.result()
            raise OSError(errno.ENOSPC, 'No space left on device')
        return real(directory, commit_futures, *args, **kwargs)

    monkeypatch.setattr(module, '_background_wait_for_commit_futures', disk_full)
    with pytest.raises(UsageError) as e:
        run(auto, plan_of(mesh8, 'dp'), task, config, tmp_path, Outputs(checkpoint_every=5))
    assert str(e.value) == (
        'could not save the checkpoint of step 10: No space left on device; '
        'the checkpoints of steps 5 are intact'
    )
    monkeypatch.undo()  # space freed: the same run resumes from step 5
    for line in (tmp_path / 'metrics.jsonl').read_text().splitlines():
        json.loads(line)  # never torn
    final = run(auto, plan_of(mesh8, 'dp'), task, config, tmp_path, Outputs(checkpoint_every=5))
    assert final['step'] == 10 and checkpoint.reader(tmp_path).all_steps() == [5, 10]


@pytest.mark.slow
def test_finished_and_ahead_runs_touch_nothing(tmp_path):
    flags = [*FAULT_FLAGS, f'--workdir={tmp_path}']
    assert run_cli('auto', *flags, '--steps=20').returncode == 0
    before = files(tmp_path)
    again = run_cli('auto', *flags, '--steps=20')
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.strip() == f'nothing to do: {tmp_path} already holds step 20'
    behind = run_cli('auto', *flags, '--steps=10')
    assert behind.returncode == 2 and 'Traceback' not in behind.stderr  # a bad --steps
    assert '--steps=10 is below the newest checkpoint' in behind.stderr
    after = files(tmp_path)
    del before[str(tmp_path / '.lock')], after[str(tmp_path / '.lock')]  # names its holder
    assert after == before


@pytest.mark.slow
def test_six_generates_beside_a_trainer_change_nothing(tmp_path):
    """Readers used to delete the trainer's save in progress (cleanup_tmp_directories) and died
    when --keep removed the step they read; the trainer must end where an undisturbed one does."""
    steps = ['--steps=300', '--keep=2']
    calm, busy = tmp_path / 'calm', tmp_path / 'busy'
    trainer = subprocess.Popen(
        [sys.executable, '-m', 'explicit.train', *FAULT_FLAGS, *steps, f'--workdir={busy}'],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not (busy / 'checkpoints' / '10').exists():
        assert trainer.poll() is None, trainer.stderr.read()[-2000:]
        time.sleep(0.1)
    second = run_cli('auto', *FAULT_FLAGS, *steps, f'--workdir={busy}')
    assert second.returncode == 2 and 'is in use by another trainer (pid' in second.stderr
    for _ in range(6):
        gen = run_cli('explicit', f'--workdir={busy}', '--max_new_bytes=8', program='generate')
        assert gen.returncode == 0 and 'Traceback' not in gen.stderr, gen.stderr[-2000:]
    _, err = trainer.communicate(timeout=600)
    assert trainer.returncode == 0, err[-2000:]
    assert run_cli('explicit', *FAULT_FLAGS, *steps, f'--workdir={calm}').returncode == 0
    assert_same_params(busy, calm)


def test_flipped_bits_in_a_checkpoint_are_refused_naming_the_intact_ones(tmp_path, monkeypatch):
    """Two bytes XOR-ed in the middle of the largest array file used to load silently (Orbax
    reads it without complaint: shown first); the SHA-256 written at save now refuses it."""
    case = make_case('transformer')
    _, _, state = fresh_state(case=case)
    for step in (5, 10):
        save_checkpoint(tmp_path, state._replace(step=np.int32(step)), case)
    folder = tmp_path / 'checkpoints' / '10'
    assert (folder / integrity.CHECKSUMS).is_file()
    biggest = max((f for f in (folder / 'state').rglob('*') if f.is_file()), key=os.path.getsize)
    data = bytearray(biggest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    data[len(data) // 2 + 1] ^= 0xFF
    biggest.write_bytes(bytes(data))
    with monkeypatch.context() as m:  # without the check: a silent wrong load
        m.setattr(checkpoint, 'verify', lambda folder: None)
        _, _, rotten = checkpoint.restore(tmp_path, make_mesh(1))
    pairs = zip(jax.tree.leaves(rotten.params), jax.tree.leaves(state.params), strict=True)
    assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)
    name = biggest.relative_to(folder).as_posix()
    expected = (
        f'checkpoint {folder} is corrupt or truncated ({name} does not match the checksum '
        'written when it was saved); intact older checkpoints: [5].'
    )
    for read in (
        lambda: checkpoint.restore(tmp_path, make_mesh(1)),  # generate, the tools
        lambda: checkpoint.read_numpy(tmp_path, 10),  # the bisector's run-directory mode
    ):
        with pytest.raises(UsageError) as e:
            read()
        assert str(e.value).startswith(expected)
    _, _, older = checkpoint.restore(tmp_path, make_mesh(1), step=5)
    assert int(older.step) == 5


@pytest.mark.slow
def test_a_step_cut_short_by_a_kill_leaks_no_orbax_notice(tmp_path, monkeypatch, caplog):
    """A kill -9 while --keep deleted an old step left it without _CHECKPOINT_METADATA; every
    later start printed Orbax's `Metadata file does not exist` (shown first), which now stays
    quiet: Orbax goes on without the file."""
    case = make_case('transformer')
    _, _, state = fresh_state(case=case)
    for step in (5, 10):
        save_checkpoint(tmp_path, state._replace(step=np.int32(step)), case)
    (tmp_path / 'checkpoints' / '5' / '_CHECKPOINT_METADATA').unlink()

    def start():  # what a resuming trainer and a reader do first
        caplog.clear()
        with caplog.at_level('WARNING'), checkpoint.manager(tmp_path) as mngr:
            assert mngr.latest_step() == 10
        checkpoint.restore(tmp_path, make_mesh(1))
        return caplog.text

    with monkeypatch.context() as m:
        m.setattr(checkpoint, 'ORBAX_NOISE', ('Given directory is read only',))
        assert 'Metadata file does not exist' in start()
    assert 'Metadata file does not exist' not in start()


def test_a_finished_run_in_a_read_only_workdir_has_nothing_to_do(mesh8, tmp_path, monkeypatch):
    """Rerunning a finished run was refused as 'not writable' (exit 2) in a read-only workdir:
    it only needs to read that the newest checkpoint is step --steps. Here every write the
    trainer could make fails, as on a read-only disk (as root, permissions would not stop it)."""
    case = make_case('transformer')
    config = dataclasses.replace(case.config, steps=20, batch_size=16)
    _, _, state = fresh_state(case=case)
    save_checkpoint(tmp_path, state._replace(step=np.int32(20)), case._replace(config=config))
    before = files(tmp_path)

    def read_only(*args, **kwargs):
        raise UsageError(f'--workdir={tmp_path} is not writable (Read-only file system)')

    for name in ('ensure_writable', 'atomic_write', 'hold_workdir', 'name_holder'):
        monkeypatch.setattr(report, name, read_only)
    monkeypatch.setattr(checkpoint, 'manager', read_only)
    task = tasks.shakespeare_task(config, TINY_TRANSFORMER)
    assert run(auto, plan_of(mesh8, 'dp'), task, config, tmp_path) is None  # nothing to do
    assert files(tmp_path) == before
    with pytest.raises(UsageError, match='not writable'):  # the check can fail: one step more
        more = dataclasses.replace(config, steps=21)
        run(auto, plan_of(mesh8, 'dp'), task, more, tmp_path)


def test_a_dangling_link_or_a_folder_in_a_files_place_is_named(tmp_path):
    """A dangling symbolic link as --workdir said 'is not writable (File exists)'; a folder named
    metrics.jsonl gave a raw [Errno 21] naming a temporary file, and the bisector then said the
    workdir had no config.json."""
    from shard_parity.tools.bisect import runs

    link = tmp_path / 'link'
    link.symlink_to(tmp_path / 'gone' / 'run')
    with pytest.raises(UsageError, match=f'--workdir={link} is a symbolic link to '
                       f'{tmp_path / "gone" / "run"}, which does not exist'):  # fmt: skip
        report.ensure_writable(link)
    (tmp_path / 'run' / 'metrics.jsonl').mkdir(parents=True)
    (tmp_path / 'run' / 'config.json').write_text('{}')
    with pytest.raises(UsageError, match=re.escape(
            f'{tmp_path / "run" / "metrics.jsonl"} is a folder, not a file: the run writes its '
            'metrics.jsonl there; move the folder aside')):  # fmt: skip
        report.ensure_writable(tmp_path / 'run')
    with pytest.raises(UsageError, match='metrics.jsonl is a folder, not the file a train run'):
        runs.read_run(str(tmp_path / 'run'))
    assert sorted(p.name for p in (tmp_path / 'run').iterdir()) == ['config.json', 'metrics.jsonl']
