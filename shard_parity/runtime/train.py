"""The training CLI every twin runs; the twin supplies only its strategy files.

    python -m auto.train --model=mlp --steps=600 --cpu_devices=8
    python -m explicit.train --model=transformer --cpu_devices=1 --workdir=runs/t

What it runs, `run`, is shard_parity/runtime/training.py; the step loop itself is in
shard_parity/runtime/loop.py. A rerun with the same --workdir resumes from its latest complete
checkpoint; --steps is the total, so a larger --steps trains on.
"""

import json
import logging as py_logging
import pathlib
import signal
import sys
import traceback

import jax
from absl import flags, logging

from shard_parity import UsageError, exit_status, refuse
from shard_parity.datasets.root import DataError
from shard_parity.devices import configure_jax, use_matmul_precision
from shard_parity.runtime import checkpoint, declare_key_flags, from_flags, plain_warnings, tasks
from shard_parity.runtime import flags as F
from shard_parity.runtime.loop import SIGNALS, Interrupted, stop_on_signals
from shard_parity.runtime.processes import start_processes
from shard_parity.runtime.training import Outputs, run, warn_unused_attention
from shard_parity.step import strategy_file


def quiet_save_errors(record) -> bool:
    """Drops what Orbax's background save thread and its asyncio tasks log when a save fails:
    the SaveError raised in the main thread says it in one line (--verbose shows all)."""
    noisy = '/orbax/' in record.pathname or record.name == 'asyncio'
    return not (record.levelno >= py_logging.ERROR and noisy)


def quiet_failed_save() -> None:
    """After a failed save (a full disk), each of tensorstore's pending writes reports into the
    closed event loop of Orbax's background thread, printing dozens of tracebacks of
    `RuntimeError: Event loop is closed` as unraisable exceptions; silence those too."""
    logging.get_absl_handler().addFilter(quiet_save_errors)
    default = sys.unraisablehook

    def hook(unraisable):
        value = unraisable.exc_value
        if not (isinstance(value, RuntimeError) and str(value) == 'Event loop is closed'):
            default(unraisable)

    sys.unraisablehook = hook


def make_task(config):
    if F.DATA_DIR.value and pathlib.Path(F.DATA_DIR.value).is_file():
        raise UsageError(
            f'--data_dir={F.DATA_DIR.value} is a file: give the folder that holds (or will hold) '
            'mnist/ and tinyshakespeare/'
        )
    if F.MODEL.value == 'mlp':
        return tasks.mnist_task(
            config, F.DATA_DIR.value, F.DOWNLOAD.value, from_flags.model_config()
        )
    return tasks.shakespeare_task(
        config, from_flags.transformer_config(), F.DATA_DIR.value, F.DOWNLOAD.value
    )


def main(twin):
    """The absl main of `python -m <twin>.train`."""

    declare_key_flags(F.TRAIN_CLI)
    F.offer_strategies(twin.STRATEGIES)  # one the twin lacks is refused at parsing
    stop_on_signals(  # before anything compiles: see shard_parity/runtime/loop.py
        'interrupted again: stopped at once, saving nothing new; rerun the same command to '
        'resume from the last checkpoint'
    )

    def _main(argv):
        if len(argv) > 1:
            refuse(f'unexpected arguments {argv[1:]}: every setting is a --flag')
        if not flags.FLAGS['verbosity'].present:  # Orbax and XLA log a lot at INFO
            logging.set_verbosity(logging.WARNING)
        if not F.VERBOSE.value:  # a failed save is reported once, by us, in one line
            quiet_failed_save()
            plain_warnings()
        try:
            configure_jax(
                F.CPU_DEVICES.value, cpu_fma=F.CPU_FMA.value, libtpu_lines=F.VERBOSE.value
            )
            start_processes(
                F.COORDINATOR.value,
                F.NUM_PROCESSES.value,
                F.PROCESS_ID.value,
                F.DISTRIBUTED_AUTO.value,
                F.HEARTBEAT_TIMEOUT.value,
            )
            jax.config.update('jax_debug_nans', F.DEBUG_NANS.value)
            workdir = pathlib.Path(F.WORKDIR.value or f'runs/{twin.NAME}_{F.MODEL.value}')
            # the plan and what its axes need first: a short --steps's warm-up check after
            plan = from_flags.plan(fit_default_batch=jax.process_count() == 1)
            strategy_file(twin, plan)  # a schedule this twin lacks on the mesh: refused now
            use_matmul_precision(plan.precision.matmul)
            warn_unused_attention(twin, plan, from_flags.model_config())
            from_flags.warn_ignored_flags()
            config = from_flags.train_config(checkpoint.latest_train_config(workdir))
            outputs = Outputs(
                F.CHECKPOINT_EVERY.value, F.KEEP.value, F.SAVE_INITIAL.value, F.SHOW_SHARDING.value
            )
            final = run(twin, plan, make_task(config), config, workdir, outputs)
        except FloatingPointError as e:  # raised by JAX's checks under --debug_nans
            if F.VERBOSE.value:
                traceback.print_exc()
            first = ' '.join(str(e)[:300].split())  # one line
            refuse(f'--debug_nans stopped training at the first NaN: {first}', 1)
        except (UsageError, DataError, OSError) as e:
            if F.VERBOSE.value:
                traceback.print_exc()
            refuse(str(e), exit_status(e))  # 2: a bad input; 1: a fault
        except Interrupted as e:
            print(e, file=sys.stderr)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:  # a signal before the first step
            print(
                'interrupted: nothing saved since the last checkpoint; rerun the same command '
                'to resume',
                file=sys.stderr,
            )
            sys.exit(128 + (SIGNALS or [signal.SIGINT])[0])
        if jax.process_index() != 0:
            return
        if final is None:
            print(f'nothing to do: {workdir} already holds step {config.steps}')
        else:
            print(json.dumps(final))

    return _main
