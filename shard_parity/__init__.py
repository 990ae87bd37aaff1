"""What every twin shares, so that a difference between twins can only come from the twins.
The project's one installed name: the twins, the inspector, the tools and the data loaders are
its subpackages (shard_parity.auto, .explicit, .typed, .inspector, .tools, .datasets).

    plan.py       the mesh's named axes (data, fsdp, stage, expert, seq, model), a Plan of
                  them, the strategy each mesh is, and what each axis must divide
    mesh.py       the mesh of a plan, emulated CPU devices
    devices.py    libtpu kept quiet on a machine without a TPU chip (before JAX starts)
    placement.py  where each array lives, one rule per axis, and the placing itself
    step.py       TrainState, AdamW, apply_gradients, the one-device step
    pipeline.py   pp's microbatches and the model cut into stages; pipeline_1f1b.py the
                  tick engine of 1F1B and interleaved (schedules.py: their tick tables)
    memory.py     the state bytes each device should hold, from the axes that split them
    model/        the MLP, the transformer, attention and the custom-backward ops
    runtime/      configs, flags, tasks, the loop, checkpoints, reports, processes, the CLIs

The parallelism itself lives in the twins' strategy files (auto/dp.py, explicit/fsdp.py, ...);
none of the modules above imports them.
"""

import os
import sys

# A checkout keeps auto/, explicit/, typed/, inspector/, tools/ and datasets/ beside this folder
# (an install puts them inside it: setup.cfg's package_dir); the checkout's root joins __path__,
# so shard_parity.auto is auto/ with or without an install, and nothing else is top-level.
_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isfile(os.path.join(_root, 'setup.cfg')):
    __path__.append(_root)


class UsageError(Exception):
    """An expected bad input: the CLI prints its one-line message and exits 2, a command line's
    usage error; a subclass for a fault met while running (a failed save, a diverged loss) sets
    `exit_code` to 1. `exit_status(e)` is the status a CLI exits with for any expected error."""

    exit_code = 2


def exit_status(error: BaseException) -> int:
    """2 for a bad input (a UsageError), 1 for a fault (a failed save or read, a diverged loss,
    the data): docs/errors.md."""
    return getattr(error, 'exit_code', 1)


BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports of a command whose reader went away


def quiet_on_broken_pipe(main):
    """`main` (an absl main), stopping quietly when the reader of stdout goes away (`... | head`):
    no BrokenPipeError traceback, neither now nor when Python flushes stdout at exit; exit 141,
    as a shell reports a command that SIGPIPE ended (`yes | head`)."""

    def run(argv):
        try:
            status = main(argv)
            sys.stdout.flush()  # a pipe closed after the last write fails here, not at exit
            return status
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush
            sys.exit(BROKEN_PIPE)

    return run


def refuse(message: str, status: int = 2):
    """Prints `error: <message>` as one line on stderr and exits `status` (2: bad input)."""
    print(f'error: {message}', file=sys.stderr)
    sys.exit(status)
