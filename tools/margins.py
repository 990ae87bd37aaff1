"""How close each parity test's measured error comes to its tolerance, on this machine.

    python -m tools.margins                 # the parity tests of the fast tier
    python -m tools.margins -m ''           # every parity test, the slow ones too
    python -m tools.margins parity_tests/test_cp.py -k gqa

Runs pytest with --margins: every comparison made through helpers.assert_close records its
largest error / allowed, and the summary prints each test's worst as a margin (allowed / error),
flagging any under 10x, so that the next tolerance at the edge of one processor's round-off is
seen before it fails on another (docs/determinism.md, "Tolerances").
"""

import sys

import pytest

# Every test file that compares through helpers.assert_close (assert_trees_close,
# assert_params_close), whose margins --margins records (test_margins.py keeps this list whole).
# test_tp.py is not one: its claims are exact (bytes, bitwise checkpoints); tp's parity is
# test_mesh_parity.py's.
PARITY = [
    'parity_tests/test_gradient_parity.py',
    'parity_tests/test_training_parity.py',
    'parity_tests/test_mesh_parity.py',
    'parity_tests/test_fsdp.py',
    'parity_tests/test_cp.py',
    'parity_tests/test_pp.py',
    'parity_tests/test_pp_schedules.py',
    'parity_tests/test_ep.py',
    'parity_tests/test_composed.py',
    'parity_tests/test_typed.py',
    'parity_tests/test_transformer.py',
    'parity_tests/test_multiprocess.py',
]


def main(argv: list[str]) -> int:
    paths = [a for a in argv if a.startswith('parity_tests/')]
    rest = [a for a in argv if a not in paths]
    tier = [] if '-m' in rest else ['-m', 'not slow']
    args = ['--margins', '-q', '-p', 'no:cacheprovider', *tier, *rest, *(paths or PARITY)]
    return pytest.main(args)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
