"""python -m tools.margins: its list of parity tests is every file that compares within a
tolerance, and it prints each one's margin."""

import pathlib
import re
import subprocess
import sys

import pytest

from parity_tests.helpers import REPO
from shard_parity.tools import margins


def test_parity_lists_every_file_that_compares_within_a_tolerance():
    """A new parity test file, or one that starts comparing through helpers.assert_close, is
    listed; one that stops is not."""
    compares = {
        f'parity_tests/{path.name}'
        for path in pathlib.Path(REPO, 'parity_tests').glob('test_*.py')
        if re.search(r'\bassert_(close|trees_close|params_close)\(', path.read_text())
    }
    assert len(compares) > 1 and sorted(margins.PARITY) == sorted(compares)


@pytest.mark.slow  # a pytest of its own
def test_margins_prints_each_tests_margin_per_tolerance():
    test = 'parity_tests/test_gradient_parity.py'
    result = subprocess.run(
        [sys.executable, '-m', 'tools.margins', test, '-k', 'twin_matches and mlp'],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = result.stdout.split('margins: allowed / largest error')[1].splitlines()[1:]
    for twin in ('auto', 'explicit', 'typed'):  # a margin (or "exact") for each, under TOL
        name = f'{test}::test_twin_matches_the_one_device_run[mlp-{twin}]'
        assert any(r.split()[1:3] == ['TOL', name] for r in rows), result.stdout[-2000:]
