"""`python -m tools.compare A B`: the comparison's command line (cli.py)."""

from absl import app

from shard_parity import quiet_on_broken_pipe
from shard_parity.runtime import declare_key_flags, parse_flags

from . import cli
from .cli import main

__doc__ = cli.__doc__  # what --help prints: absl reads the __main__ module's docstring

declare_key_flags([], cli.__name__)  # --help exits 0: asking for help is not an error
app.run(quiet_on_broken_pipe(main), flags_parser=parse_flags)  # `| head -n 1`: quietly
