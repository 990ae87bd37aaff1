"""How close each parity test's measured error comes to its tolerance, on this machine.

    python -m tools.margins                 # the parity tests of the fast tier
    python -m tools.margins -m ''           # every parity test, the slow ones too
    python -m tools.margins parity_tests/test_cp.py -k gqa

Runs pytest with --margins: every comparison made through helpers.assert_close records its
largest error / allowed, and the summary prints each test's worst as a margin (allowed / error),
flagging any under 10x, so that the next tolerance at the edge of one processor's round-off is
seen before it fails on another (docs/determinism.md, "Tolerances"). The bf16 tests under the
error model (test_numerics.py, test_detection.py) print, per case, a correct pair's largest
error as a fraction of its budget (flagged over 1/3), a bug's in budgets over (flagged under
10), and a small bug that bf16 cannot see its float32 effect as a fraction of the detection
limit (the budget at the leaf it moves: docs/detection.md).

The tests are the checkout's (parity_tests/ is not installed) and run with pytest (the `test`
extra): `python -m shard_parity.tools.margins` runs from any directory in a checkout's install
(`pip install -e ".[test]"`), and answers one line, exit 2, where either is missing. Exit 0: the
tests passed; 1: one failed; 2: refused input; 130: interrupted.
"""

import argparse
import os
import pathlib
import sys

from shard_parity import refuse

# Every test file that compares through helpers.assert_close (assert_trees_close,
# assert_params_close) or records a bisector's report under the error model (record_model),
# whose margins --margins records (test_margins.py keeps this list whole).
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
    'parity_tests/test_composed_schedules.py',
    'parity_tests/test_eval_steps.py',
    'parity_tests/test_typed.py',
    'parity_tests/test_transformer.py',
    'parity_tests/test_multiprocess.py',
    'parity_tests/test_numerics.py',  # the error model's: fractions of budgets (record_model)
    'parity_tests/test_detection.py',  # small bugs: caught, or their effect / bf16's limit
    'parity_tests/test_accumulation.py',
    'parity_tests/test_remat.py',
    'parity_tests/test_splash.py',
    'parity_tests/test_zero1.py',
]
# This file is tools/margins.py of a checkout (an editable install maps shard_parity.tools to
# it); installed from a wheel, its parent holds no parity_tests/.
CHECKOUT = pathlib.Path(__file__).resolve().parents[1]
# pytest's exit codes as this project's (docs/errors.md): 1 a test failed, 2 pytest's own
# "interrupted" (Ctrl-C) is 130, 3 an internal error is a failure, 4 a usage error is refused
# input, 5 "no tests collected" (-k or -m matched none) is refused input.
PYTEST_CODES = {0: 0, 1: 1, 2: 130, 3: 1, 4: 2, 5: 2}


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints its usage and exits 2: one line instead
        refuse(f'{message} (--help lists the options)')


def parser() -> Parser:
    p = Parser(
        prog='python -m tools.margins',
        description='Runs the parity tests with pytest --margins and prints each test\'s margin '
        '(allowed / largest error).',
    )
    p.add_argument(
        'paths', nargs='*', metavar='PATH',
        help='parity test files or node ids in them (default: every parity test file, '
        'PARITY in tools/margins.py)',
    )  # fmt: skip
    p.add_argument(
        '-m', dest='markers', default='not slow', metavar='MARKEXPR',
        help="pytest's -m (default: 'not slow'; -m '' runs the slow tests too)",
    )  # fmt: skip
    p.add_argument('-k', dest='keyword', metavar='EXPRESSION', help="pytest's -k")
    return p


def checked(paths: list[str]) -> list[str]:
    """The paths as PARITY names them (from the checkout's root), each a parity test file or a
    node id in one; one line, exit 2, for any other: a file outside PARITY records no margin."""
    out = []
    for path in paths:
        file, sep, node = path.partition('::')
        where = pathlib.Path(file).resolve()  # given from here: ./parity_tests/..., absolute
        if where.is_file() and where.is_relative_to(CHECKOUT):
            file = where.relative_to(CHECKOUT).as_posix()
        if file not in PARITY:
            names = ', '.join(p.removeprefix('parity_tests/') for p in PARITY)
            refuse(f'{path} is not a parity test file (one that compares within a tolerance): '
                   f'give parity_tests/ and one of {names}')  # fmt: skip
        out.append(file + sep + node)
    return out


def pytest_args(args) -> list[str]:
    keyword = ['-k', args.keyword] if args.keyword is not None else []
    tier = ['-m', args.markers]
    return ['--margins', '-q', '-p', 'no:cacheprovider', *tier, *keyword, *(args.paths or PARITY)]


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    args.paths = checked(args.paths)
    if not (CHECKOUT / 'parity_tests' / 'conftest.py').is_file():
        refuse(
            'the parity tests are not installed: run this from an install of a checkout '
            '(git clone, then pip install -e ".[test]")'
        )
    try:
        import pytest
    except ImportError:
        refuse('this runs the parity tests with pytest, which is not installed: pip install -e '
               f'"{CHECKOUT}[test]"')  # fmt: skip
    os.chdir(CHECKOUT)  # the tests' paths, conftest.py and setup.cfg's [tool:pytest] are here
    code = int(pytest.main(pytest_args(args)))
    if code == 5:
        print('error: no parity test matches the given paths, -k and -m', file=sys.stderr)
    return PYTEST_CODES.get(code, 1)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
