"""`python -m tools.fuzz`: the fuzzer's command line (cli.py)."""

import sys

from absl import app

from shard_parity import refuse
from shard_parity.runtime import declare_key_flags, parse_flags

try:
    import hypothesis  # noqa: F401  (the test extra's)
except ModuleNotFoundError:
    refuse("tools.fuzz draws with Hypothesis, which is not installed: pip install -e '.[test]'")

from . import cli
from .cli import main  # noqa: E402 (after the check above: it imports Hypothesis)

__doc__ = cli.__doc__  # what --help prints: absl reads the __main__ module's docstring

declare_key_flags([], cli.__name__)  # --help lists this module's flags and exits 0
try:
    app.run(main, flags_parser=parse_flags)
except KeyboardInterrupt:  # Ctrl-C before main's run started (main reports one after)
    print('interrupted (Ctrl-C) before the run started: nothing found', file=sys.stderr)
    sys.exit(130)
