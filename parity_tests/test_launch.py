"""`python -m tools.launch`: it never hangs on a process that exits or on a signal (and,
given --timeout, not on processes that all hang), passes signals on, names a missing program in
one line, keeps gloo's lines and its own notes off the progress bar unless --verbose, and leaves no
process and no temporary folder behind (except a failed process's log).

The launched programs are tiny `python -c` scripts, not training: each reads its --process_id
from the flags the launcher appends and does what its part of the plan says."""

import os
import signal
import subprocess
import sys
import time

import pytest

from parity_tests._http import skip_without_tcp
from parity_tests.helpers import REPO

# What process i does is the i-th item of argv[1]: 'exit:N' exits N at once; 'gloo' prints what
# gloo prints on connecting and a line of its own, and exits 0; 'sleep' draws a progress bar
# (no newline) and sleeps,
# leaving quietly (exit 3) on SIGINT or SIGTERM; 'deaf' sleeps and ignores both. Each sleeper
# first writes <READY>/ready_<i>, and on a signal <READY>/got_<i>_<signal>.
CHILD = """
import os, signal, sys, time
i = int(next(a for a in sys.argv if a.startswith('--process_id=')).split('=')[1])
plan = sys.argv[1].split(',')[i]
if plan.startswith('exit:'):
    sys.exit(int(plan[5:]))
if plan == 'gloo':
    print(f'[Gloo] Rank {i} is connected to 1 peer ranks. Expected number of connected peer ranks is : 1')
    print(f"process {i} says hello ({os.environ.get('TF_CPP_MIN_LOG_LEVEL')})")
    sys.exit(0)
def leave(signum, frame):
    open(os.path.join(os.environ['READY'], f'got_{i}_{signum}'), 'w').close()
    sys.exit(3)
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN if plan == 'deaf' else leave)
sys.stderr.write('\\rstep 1/10')
sys.stderr.flush()
open(os.path.join(os.environ['READY'], f'ready_{i}'), 'w').close()
time.sleep(600)
"""
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}  # as a user's
TIMEOUT = 30  # far more than any of these needs; the old launcher hung past it


def alive(pid: int) -> bool:
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'  # a zombie has ended
    except FileNotFoundError:
        return False


class Launch:
    """One launcher, in its own session, so that whatever it leaves can be found and killed."""

    def __init__(self, tmp_path, *args, plan=None, grace=1, extra=('--verbose',)):
        self.tmp = tmp_path / 'tmp'  # the launcher's TMPDIR: where its log folder goes
        self.ready = tmp_path / 'ready'
        self.tmp.mkdir()
        self.ready.mkdir()
        program = [sys.executable, '-c', CHILD, plan] if plan else list(args)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                '-m',
                'tools.launch',
                '--num_processes=2',
                '--cpu_devices_per_process=1',
                f'--grace_seconds={grace}',
                *extra,
                '--',
                *program,
            ],
            cwd=REPO,
            env={**CLEAN_ENV, 'TMPDIR': str(self.tmp), 'READY': str(self.ready)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.started = time.monotonic()

    def wait_ready(self, n=2):
        deadline = time.monotonic() + TIMEOUT
        while len(list(self.ready.glob('ready_*'))) < n:
            assert time.monotonic() < deadline and self.proc.poll() is None, 'never started'
            time.sleep(0.02)

    def finish(self):
        try:
            self.out, self.err = self.proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f'the launcher did not return within {TIMEOUT} s')
        self.seconds = time.monotonic() - self.started
        self.pids = [
            int(line.split()[-1])
            for line in self.err.splitlines()
            if line.startswith('[launch] process ') and ': pid ' in line
        ]
        return self

    def kill(self):  # the launcher and every process it started (they share its group)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.communicate()

    def left_running(self):
        return [pid for pid in self.pids if alive(pid)]

    def folders(self):
        return sorted(self.tmp.iterdir())


@pytest.fixture
def launcher(tmp_path):
    skip_without_tcp('tools.launch gives its processes a loopback port to meet on')
    made = []

    def make(*args, **kwargs):
        made.append(Launch(tmp_path, *args, **kwargs))
        return made[-1]

    yield make
    for launch in made:
        launch.kill()


@pytest.mark.parametrize('first', [0, 1])
def test_a_hung_process_is_killed_once_another_has_exited(launcher, first):
    done = launcher(plan=f'exit:{first},sleep').finish()
    assert done.proc.returncode == 1, done.err
    assert '[launch] error: process 1 did not exit within 1 s of process 0; killed it' in done.err
    assert done.seconds < 15
    assert len(done.pids) == 2 and not done.left_running()


def test_a_good_run_exits_0_and_leaves_no_folder(launcher):
    done = launcher(plan='exit:0,exit:0').finish()
    assert done.proc.returncode == 0, done.err
    assert done.folders() == []
    assert len(done.pids) == 2 and not done.left_running()


def test_a_failed_process_keeps_its_log_folder_and_names_it(launcher):
    done = launcher(plan='exit:0,exit:3').finish()
    assert done.proc.returncode == 3  # the one failed process's own status
    [folder] = done.folders()
    assert (folder / 'process_1.log').exists()
    assert f'[launch] process 1 exited with 3; its log ({folder}/process_1.log) ends:' in done.err
    assert f'[launch] the logs stay in {folder}' in done.err
    assert done.err.strip().splitlines()[-1] == '[launch] error: processes [1] failed'


@pytest.mark.parametrize('plan, code', [('exit:2,exit:2', 2), ('exit:2,exit:1', 1)])
def test_the_processes_status_is_the_launchers_where_they_agree(launcher, plan, code):
    """Every process refusing its input (exit 2) makes the launcher exit 2, as the command alone
    would (docs/errors.md: each code means one thing in every CLI); processes that failed in
    different ways make it 1, a failure while running (the check can fail: 2 is not passed on)."""
    done = launcher(plan=plan).finish()
    assert done.proc.returncode == code, done.err
    assert done.err.strip().splitlines()[-1] == '[launch] error: processes [0, 1] failed'


@pytest.mark.parametrize(
    'sig, code', [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=['SIGINT', 'SIGTERM']
)
def test_a_signal_is_passed_on_and_the_processes_waited_for(launcher, sig, code):
    launch = launcher(plan='sleep,sleep', grace=20)
    launch.wait_ready()
    launch.proc.send_signal(sig)
    done = launch.finish()
    assert done.proc.returncode == code, done.err
    assert done.seconds < 15  # they left at once: nobody waited out the grace
    got = sorted(p.name for p in done.ready.glob('got_*'))
    assert got == [f'got_0_{int(sig)}', f'got_1_{int(sig)}']
    assert 'Traceback' not in done.err and 'killed' not in done.err, done.err
    assert done.folders() == [] and not done.left_running()
    ours = [line for line in done.err.split('\n') if '[launch]' in line]  # not on the bar
    assert ours and all(line.startswith('[launch]') for line in ours), done.err


def test_a_process_that_ignores_the_signal_is_killed_after_the_grace(launcher):
    launch = launcher(plan='sleep,deaf')
    launch.wait_ready()
    launch.proc.send_signal(signal.SIGTERM)
    done = launch.finish()
    assert done.proc.returncode == 143, done.err
    assert '[launch] error: process 1 did not exit within 1 s of SIGTERM; killed it' in done.err
    assert 'Traceback' not in done.err
    assert done.folders() == [] and not done.left_running()


def test_a_missing_program_is_named_in_one_line(launcher):
    done = launcher('no_such_program_4711').finish()
    assert done.proc.returncode == 127
    assert done.err.strip().splitlines() == [
        '[launch] error: cannot run no_such_program_4711: No such file or directory'
    ]
    assert done.folders() == []


def test_timeout_stops_processes_that_all_hang(launcher):
    """Every process hanging (a deadlocked collective) was noticed by nothing: --timeout stops
    them as a SIGTERM would, then kills what is left, and exits 124."""
    done = launcher(plan='sleep,deaf', extra=['--verbose', '--timeout=3'])
    done.finish()
    assert done.proc.returncode == 124, done.err
    assert '[launch] error: --timeout=3 s passed; stopping the processes' in done.err
    assert 'process 1 did not exit within 1 s of SIGTERM; killed it' in done.err
    assert sorted(p.name for p in done.ready.glob('got_*')) == [f'got_0_{int(signal.SIGTERM)}']
    assert done.seconds < 20 and not done.left_running()


def test_a_forgotten_double_dash_is_named():
    result = subprocess.run(
        [sys.executable, '-m', 'tools.launch', 'python', '-m', 'auto.train', '--steps=5'],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and 'Traceback' not in result.stderr  # refused input
    assert result.stderr.strip().splitlines() == [
        'error: put -- before the command: python -m tools.launch [--num_processes=N] '
        '-- python -m auto.train --steps=5'
    ]


@pytest.mark.parametrize('verbose', [False, True])
def test_gloo_lines_and_pids_only_with_verbose(launcher, verbose):
    """Gloo's connection lines (process 0's stdout) and the launcher's pid notes landed in the
    middle of the progress bar: they now show only with --verbose. Process 0's own lines stay."""
    done = launcher(plan='gloo,gloo', extra=['--verbose'] if verbose else []).finish()
    assert done.proc.returncode == 0, done.err
    gloo = '[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1'
    hello = f'process 0 says hello ({None if verbose else 2})'  # JAX's C++ warnings off too
    assert done.out.splitlines() == ([gloo] if verbose else []) + [hello]
    assert len(done.pids) == (2 if verbose else 0), done.err
    assert done.err == '' or verbose, done.err
