"""Claim: an interrupt loses nothing. Ctrl-C (SIGINT) or SIGTERM, even during the first compile,
saves the step reached and exits in one line (130 or 143); the same command then resumes to the
very parameters of an undisturbed run; a second one stops at once, saving nothing new. (Several
processes: test_multiprocess.py; a shared workdir, a full disk, a torn log: test_faults.py.)"""

import signal
import subprocess
import sys
import time

import pytest

from parity_tests.helpers import REPO, run_cli
from parity_tests.helpers import FAULT_FLAGS as FLAGS
from parity_tests.helpers import assert_same_params


@pytest.mark.slow
@pytest.mark.parametrize(  # Ctrl-C's exit 130 in the exhaustive tier: the same save and resume
    'sig, code',
    [pytest.param(signal.SIGINT, 130, marks=pytest.mark.exhaustive), (signal.SIGTERM, 143)],
)
def test_an_interrupted_run_saves_and_resumes_to_the_same_parameters(sig, code, tmp_path):
    """SIGINT lands during the first compile (it used to segfault there), SIGTERM mid-run."""
    flags = [*FLAGS, '--steps=60', f'--workdir={tmp_path / "run"}']
    proc = subprocess.Popen(
        [sys.executable, '-u', '-m', 'auto.train', *flags],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for = 'auto:' if sig == signal.SIGINT else 'step 10:'  # the bar, or the first eval
    seen = ''
    while wait_for not in seen:
        seen += proc.stdout.read(1) if sig == signal.SIGTERM else proc.stderr.read(1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == code, err[-2000:]
    assert 'Traceback' not in err
    stopped = [line for line in err.replace('\r', '\n').splitlines() if 'interrupted at' in line]
    assert len(stopped) == 1 and stopped[0].endswith('rerun the same command to resume'), err
    step = int(stopped[0].split()[3].rstrip(';'))
    assert f'saved checkpoint {step};' in stopped[0] and 0 < step < 60
    assert (tmp_path / 'run' / 'checkpoints' / str(step)).is_dir()
    assert run_cli('auto', *flags).returncode == 0
    straight = [*FLAGS, '--steps=60', f'--workdir={tmp_path / "straight"}']
    assert run_cli('auto', *straight).returncode == 0
    assert_same_params(tmp_path / 'run', tmp_path / 'straight')


@pytest.mark.slow
def test_a_second_ctrl_c_during_the_first_compile_exits_at_once(tmp_path):
    """The second signal raised a KeyboardInterrupt, which landed in a callback from XLA's C++
    during the compile: a traceback, then the run went on to save step 1 (or crashed)."""
    proc = subprocess.Popen(
        [sys.executable, '-u', '-m', 'auto.train', *FLAGS, '--steps=60', f'--workdir={tmp_path}'],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = ''
    while 'auto:' not in seen:  # the bar: the first step is compiling
        seen += proc.stderr.read(1)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)  # the first handler has run (two at once would count as one)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert 'Traceback' not in err and 'saved checkpoint' not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == (
        'interrupted again: stopped at once, saving nothing new; rerun the same command to '
        'resume from the last checkpoint'
    )
