"""python -m tools.margins: its list of parity tests is every file that compares within a
tolerance, and it prints each one's margin."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from parity_tests.helpers import REPO
from shard_parity.tools import margins


@pytest.mark.parametrize(
    'args, says',
    [
        (['--nosuchflag'], 'unrecognized arguments: --nosuchflag'),
        (['parity_tests/test_tp.py'], 'parity_tests/test_tp.py is not a parity test file'),
        (['-m'], 'argument -m: expected one argument'),
    ],
)
def test_a_refused_input_is_one_line_and_exit_2(args, says, capsys):
    """In this process: argparse's usage and its exit 2 as one `error: ...` line, as in every
    CLI; a file that is not a parity test (it records no margin) is refused by name."""
    with pytest.raises(SystemExit) as exited:
        margins.main(args)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.startswith('error: ') and says in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_an_install_without_the_tests_says_what_it_needs(monkeypatch, tmp_path, capsys):
    """Installed from a wheel, shard_parity.tools has no parity_tests/ beside it: one line."""
    monkeypatch.setattr(margins, 'CHECKOUT', tmp_path)
    with pytest.raises(SystemExit) as exited:
        margins.main([])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.startswith('error: the parity tests are not installed')


def test_paths_given_from_anywhere_name_the_checkouts_files(monkeypatch, tmp_path):
    """./parity_tests/x.py, an absolute path and a node id name PARITY's file; the tests then
    run from the checkout's root, wherever margins was started."""
    path = 'parity_tests/test_cp.py'
    monkeypatch.chdir(REPO)
    assert margins.checked([f'./{path}', f'{REPO}/{path}::test_x', path]) == [
        path, f'{path}::test_x', path,
    ]  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert margins.checked([f'{REPO}/{path}']) == [path]
    assert margins.CHECKOUT == pathlib.Path(REPO).resolve()


def test_parity_lists_every_file_that_compares_within_a_tolerance():
    """A new parity test file, or one that starts comparing through helpers.assert_close, is
    listed; one that stops is not."""
    compares = {
        f'parity_tests/{path.name}'
        for path in pathlib.Path(REPO, 'parity_tests').glob('test_*.py')
        if re.search(
            r'\b(assert_(close|trees_close|params_close)|record_model)\(', path.read_text()
        )
    }
    assert len(compares) > 1 and sorted(margins.PARITY) == sorted(compares)


@pytest.mark.slow  # a pytest of its own
def test_margins_prints_each_tests_margin_per_tolerance(tmp_path):
    """By its installed name, from a folder outside the checkout (the checkout on PYTHONPATH
    stands for its install): it runs the checkout's tests, not pytest's usage error, exit 4."""
    test = 'parity_tests/test_gradient_parity.py'
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get('PYTHONPATH', '')]))
    if 'SHARD_PARITY_DATA_DIR' in env:
        env['SHARD_PARITY_DATA_DIR'] = os.path.abspath(env['SHARD_PARITY_DATA_DIR'])
    result = subprocess.run(
        [sys.executable, '-m', 'shard_parity.tools.margins', test, '-k', 'twin_matches and mlp'],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = result.stdout.split('margins: allowed / largest error')[1].splitlines()[1:]
    for twin in ('auto', 'explicit', 'typed'):  # a margin (or "exact") for each, under TOL
        name = f'{test}::test_twin_matches_the_one_device_run[mlp-{twin}]'
        assert any(r.split()[1:3] == ['TOL', name] for r in rows), result.stdout[-2000:]
