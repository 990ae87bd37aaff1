"""The table of docs/errors.md, row by row: (what goes wrong, the message fragment the user sees,
the test that shows it). test_bad_inputs.py checks that every row is in the docs and names a test
that exists, and runs the rows whose test is its test_cli_row (CLI_ROWS there: each one's
command); the other rows point at the test file that owns them.

The rows live in six files by subject (parity_tests/errors/): train.py (the train CLI's flags
and the model's shape), meshes.py (meshes, plans, schedules, precision), runs.py (workdirs,
checkpoints, resuming, signals, the launcher, data, exit codes), tools.py (generate, compare,
the bisector, margins), inspector.py (the inspector, the benchmarks) and fuzz.py (the fuzzer).
A new row goes at the end of its subject's file, and in docs/errors.md's table.
"""

from parity_tests.errors import fuzz, inspector, meshes, runs, tools, train

ROWS = [*train.ROWS, *meshes.ROWS, *runs.ROWS, *tools.ROWS, *inspector.ROWS, *fuzz.ROWS]
