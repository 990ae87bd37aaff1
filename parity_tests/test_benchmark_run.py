"""Claim: `python -m benchmarks.run` respects the checkout and the user's time. Bad input (an
empty or unknown section list, an --out it could not write) is one line and exit 2 before any
section runs; section cli without the data is the train CLI's one line; Ctrl-C is one line and
exit 130; a run of some sections merges into the recorded results; `--target` writes nothing
into the checkout unless told to, and its header names the target. Each runs the command in a
subprocess (slow tier); the merging and the checks themselves are in test_benchmark_report.py."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from parity_tests.helpers import REPO
from shard_parity.devices import libtpu_installed
from shard_parity import config as cfg


def benchmark(*flags, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, '-m', 'benchmarks.run', *flags], cwd=REPO, capture_output=True,
        text=True, timeout=timeout, env=dict(os.environ, **(env or {})),
    )  # fmt: skip


def one_line(result, status: int, message: str) -> None:
    assert result.returncode == status, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()  # one line: no traceback, no section ran
    assert message in line, line


@pytest.mark.slow  # five runs, each refused before its first section: about 5 s each
def test_bad_sections_and_outputs_are_refused_before_any_section(tmp_path):
    (tmp_path / 'afile').write_text('x')
    one_line(benchmark('--sections='), 2, '--sections is empty: name one or more of chip_memory, twins,')
    one_line(benchmark('--sections=foo'), 2, "--sections has ['foo']; choose from")
    one_line(benchmark('--sections=nanogpt', '--out=/sys/x'), 2,
             '--out=/sys/x: cannot write in /sys')  # fmt: skip
    one_line(benchmark('--sections=nanogpt', f'--out={tmp_path}/afile'), 2,
             'afile is a file, not a folder')  # fmt: skip
    # section cli trains on Tiny Shakespeare: missing (and no way to download it, whatever the
    # network), the train CLI's line, at once
    offline = {'SHARD_PARITY_DATA_DIR': str(tmp_path / 'data'), 'https_proxy': 'http://127.0.0.1:9',
               'HTTPS_PROXY': 'http://127.0.0.1:9'}  # fmt: skip
    one_line(benchmark('--sections=cli', f'--out={tmp_path}', env=offline), 1,
             'Tiny Shakespeare file')  # fmt: skip
    assert not list(tmp_path.glob('results*'))  # nothing written


def test_section_clis_child_passes_on_its_one_line(monkeypatch):
    """The child's own `error: ...` line (a bad input, the data's absence) and its status, not
    its stderr pasted into a traceback."""
    from benchmarks import SectionFailed, cli

    said = 'Traceback (most recent call last):\n  ...\nerror: the data is missing\n'
    monkeypatch.setattr(
        cli.subprocess, 'run',
        lambda *a, **k: subprocess.CompletedProcess(a, 1, stdout='', stderr=said),
    )  # fmt: skip
    with pytest.raises(SectionFailed, match='^section cli: the data is missing$') as e:
        cli.cli(2, [16], 1, 2, cfg.TransformerConfig())
    assert e.value.status == 1


@pytest.mark.slow
def test_the_section_cli_child_says_a_bad_input_in_one_line():
    config = dataclasses.asdict(cfg.TransformerConfig()) | {'embed_dim': 30}
    args = {'n': 2, 'batch_sizes': [16], 'rounds': 1, 'steps': 2, 'model_config': config,
            'cpu_fma': False}  # fmt: skip
    child = subprocess.run(
        [sys.executable, '-m', 'benchmarks.cli', json.dumps(args)], cwd=REPO,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    one_line(child, 2, 'error: --embed_dim=30 is not divisible by --num_heads=4')


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    """Ctrl-C during a section: its children stopped, nothing written, one line."""
    run = subprocess.Popen(
        [sys.executable, '-m', 'benchmarks.run', '--sections=nanogpt', '--rounds=2',
         f'--out={tmp_path}'], cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    started = time.monotonic()
    assert run.stderr.readline().startswith('[nanogpt] running'), 'the section did not start'
    time.sleep(2)  # its child process (2 devices) is starting
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 130, err[-2000:]
    assert [ln for ln in err.splitlines() if not ln.startswith('[nanogpt] running')] == [
        'interrupted during section nanogpt (Ctrl-C): nothing written'
    ], err[-2000:]
    assert out == '' and list(tmp_path.iterdir()) == []
    assert time.monotonic() - started < 60


@pytest.mark.slow  # compiles the context section's five programs at T = 64: about 30 s
def test_a_run_of_one_section_merges_into_the_recorded_results(tmp_path):
    shutil.copy(os.path.join(REPO, 'benchmarks/results/results.json'), tmp_path)
    recorded = json.loads((tmp_path / 'results.json').read_text())
    result = benchmark('--sections=context', '--context_lengths=64', '--context_timed=',
                       f'--out={tmp_path}')  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert f'merged section(s) context into {tmp_path}/results.json; kept twins, sweep' in (
        result.stderr
    )
    merged = json.loads((tmp_path / 'results.json').read_text())
    kept = {k: v for k, v in recorded.items() if k != 'merged'}  # (its own notes: another run's)
    assert {k: merged[k] for k in kept} == kept  # nothing replaced
    assert merged['context'][0]['seq_len'] == 64 and merged['merged'][-1]['sections'] == ['context']
    assert 'Section(s) context, rerun:' in (tmp_path / 'results.md').read_text()


@pytest.mark.slow
@pytest.mark.skipif(not libtpu_installed(), reason='libtpu is not installed')
def test_a_target_run_leaves_the_checkout_alone_and_names_its_target():
    """benchmarks.run --sections=context --target (issue 39, item 9): compiled for the TPU,
    its header names it, and with no --out nothing lands in benchmarks/results."""
    results = os.path.join(REPO, 'benchmarks/results')
    before = sorted(os.listdir(results))
    result = benchmark('--sections=context', '--context_lengths=256', '--target=tpu-v5e-8')
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(os.listdir(results)) == before
    assert '--target=tpu-v5e-8: nothing written (the tables follow)' in result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith('Compiled for tpu-v5e-8 (8 TPU v5 lite devices) from shapes alone')
    assert "peak on tpu-v5e-8" in result.stdout and '| 256 |' in result.stdout
