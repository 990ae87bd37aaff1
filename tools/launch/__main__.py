"""`python -m tools.launch -- CMD`: the launcher's command line (cli.py)."""

from absl import app

from shard_parity.runtime import declare_key_flags

from . import cli
from .cli import main, parse_flags

__doc__ = cli.__doc__  # what --help prints: absl reads the __main__ module's docstring

declare_key_flags([], cli.__name__)  # --help exits 0: asking for help is not an error
app.run(main, flags_parser=parse_flags)
