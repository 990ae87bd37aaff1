"""`python -m tools.bisect`: the bisector's command line (cli.py)."""

from absl import app, flags

from shard_parity.runtime import declare_key_flags, parse_flags
from shard_parity.runtime import flags as F

from . import cli
from .cli import DEFAULT_STEPS, main

__doc__ = cli.__doc__  # what --help prints: absl reads the __main__ module's docstring

declare_key_flags(  # the train CLI's flags it reads: listed by --help, which exits 0
    [F.MODEL, F.STRATEGY, F.MESH, F.NUM_DEVICES, F.CP_LAYOUT, F.MICROBATCHES]
    + [F.PP_SCHEDULE, F.PP_VIRTUAL, *F.TRAIN.values(), *F.TRANSFORMER_SHAPE, *F.PRECISION]
    + [F.SHARD_OPTIMIZER]
    + [F.CPU_DEVICES, F.CPU_FMA, F.DATA_DIR, F.DOWNLOAD, F.VERBOSE],
    cli.__name__,
)
flags.FLAGS['steps'].help = f'How many steps to compare. Default: {DEFAULT_STEPS}.'
app.run(main, flags_parser=parse_flags)
