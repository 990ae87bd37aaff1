"""Everything around the step: configs, flags, tasks (data, losses, evaluation), the training
loop, checkpoints, reports, joining several processes, and the train and generate CLIs that
every twin runs. Here: what a CLI's --help lists (flags.py holds the flags themselves;
benchmarks/run.py, which defines its own, uses this too)."""

import functools
import logging as py_logging
import sys

from absl import app, logging
from absl.flags import FLAGS  # (not `flags`: that name is our flags.py)


def declare_key_flags(holders, defined_in: str | None = None) -> None:
    """Makes `holders`, and every flag the module named `defined_in` defines, key flags of the
    program being run, so that its --help lists them (the CLIs' flags live in flags.py, or in a
    tool package's cli.py, not in the __main__ module, where absl looks), and lets --help and
    --helpfull exit 0: asking for help is not an error."""
    names = [holder.name for holder in holders]
    names += [flag.name for flag in FLAGS.get_flags_for_module(defined_in)] if defined_in else []
    for name in names:
        FLAGS.register_key_flag_for_module(sys.argv[0], FLAGS[name])
    app.define_help_flags()
    for name in ('help', 'helpshort', 'helpfull'):
        flag = FLAGS[name]
        flag.parse = functools.partial(_exit_zero, flag.parse)


def parse_flags(argv):
    """absl's flag parsing (app.run's flags_parser), but a flag it refuses is one line,
    `error: ...`, exit 2, as every other bad input in every CLI (docs/errors.md); absl's own
    parser prints two lines and exits 1."""
    from absl.flags import Error

    from shard_parity import refuse

    try:
        return FLAGS(argv)
    except Error as e:
        refuse(' '.join(f'{e} (--help lists the flags)'.split()))


def _exit_zero(parse, arg):
    try:
        parse(arg)
    except SystemExit:  # absl exits 1 after printing the help
        sys.exit(0)


class _Plain(py_logging.Formatter):
    def format(self, record):
        return f'{record.levelname.lower()}: {record.getMessage()}'


def plain_warnings() -> None:
    """What is logged for the user reads `warning: ...`, not absl's format with its date, thread
    id and source line (--verbose keeps absl's)."""
    logging.get_absl_handler().python_handler.setFormatter(_Plain())
