"""The training CLI every twin runs; the twin supplies only its strategy files.

    python -m auto.train --model=mlp --steps=600 --cpu_devices=8
    python -m explicit.train --model=transformer --cpu_devices=1 --workdir=runs/t

The step loop itself is in shard_parity/runtime/loop.py. A rerun with the same --workdir resumes from
its latest complete checkpoint; --steps is the total, so a larger --steps trains on.
"""

import json
import logging as py_logging
import pathlib
import signal
import sys
import traceback

import jax
from absl import flags, logging
from flax import nnx

from shard_parity import UsageError
from shard_parity import plan as plans
from shard_parity.datasets.root import DataError
from shard_parity.mesh import SEQ, configure_jax, mesh_for
from shard_parity.pipeline import check_schedule, virtual_stages
from shard_parity.placement import place_state, state_shardings
from shard_parity.runtime import checkpoint, declare_key_flags, plain_warnings, report, tasks
from shard_parity.runtime import config as cfg
from shard_parity.runtime import flags as F
from shard_parity.runtime.loop import SIGNALS, Interrupted, Loop, stop_on_signals
from shard_parity.runtime.processes import start_processes
from shard_parity.step import create_state, make_optimizer


def check_strategy(
    strategy: str, model_config, mesh, batch_size: int, microbatches=4, layout='zigzag', ring=False,
    schedule='gpipe', virtual=None,
) -> None:
    """What each of the mesh's axes needs (shard_parity/plan.py: heads, layers, experts, the
    sequence, the rows and microbatches divisible), and the pipeline's schedule
    (shard_parity/pipeline.py), before anything compiles. `ring`: the twin runs its own ring
    attention under 'seq' (its RING), and ignores --attention."""
    plan = plans.of(mesh, strategy)
    plans.check(plan, model_config, batch_size, microbatches, layout)
    if plan.uses(plans.STAGE) or schedule != 'gpipe' or virtual is not None:
        layers = getattr(model_config, 'num_layers', 0)
        stages = plan.size(plans.STAGE) if plan.uses(plans.STAGE) else 1
        check_schedule(schedule, virtual, stages, layers, microbatches, plan.strategy)
    fused = getattr(model_config, 'attention', None) == 'fused'
    if plan.uses(SEQ) and fused and ring:
        logging.warning(
            "--attention=fused is ignored: this twin's %s.py runs its own ring attention in "
            "place of the model's",
            strategy,
        )


def mesh_from_flags(axis_type, devices: int, ring=False, schedules=False):
    """(plan, mesh) of --mesh and --strategy over `devices` devices, checked before anything
    compiles: the train CLI's, the inspector's and the bisector's. `ring`: as check_strategy's.
    `schedules`: whether the caller runs --pp_schedule's files (the train CLI); the inspector
    and the bisector run each twin's STRATEGIES, GPipe's pp.py, and refuse another schedule."""
    if not schedules and F.PP_SCHEDULE.value != 'gpipe':
        raise UsageError(
            f'--pp_schedule={F.PP_SCHEDULE.value}: this tool runs the twins\' pp.py (gpipe); '
            'the train CLIs run the other schedules, and the bisector takes their module: '
            '--twins=explicit,explicit.pp_1f1b'
        )
    plan = F.plan(devices)
    mesh = mesh_for(plan, axis_type)
    check_strategy(
        plan.strategy, F.model_config(), mesh, F.batch_size(), F.MICROBATCHES.value,
        F.CP_LAYOUT.value, ring, F.PP_SCHEDULE.value, F.PP_VIRTUAL.value,
    )  # fmt: skip
    return plan, mesh


def restore_latest(mngr, state, saved: dict, mesh, steps: int):
    """(state, step): the latest complete checkpoint if this workdir has one, else (state, 0).
    Refuses a checkpoint of other settings, or one beyond --steps."""
    step = mngr.latest_step()
    if step is None:
        return state, 0
    checkpoint.check_compatible(checkpoint.read_config(mngr, step), saved)
    if step > steps:
        raise UsageError(
            f'--steps={steps} is below the newest checkpoint in {mngr.directory} (step {step}): '
            f'--steps is the total, so give --steps={step} or more, or another --workdir'
        )
    if step == steps:
        return None, step  # nothing to do
    target = checkpoint.target_for(state, state_shardings(state, mesh, saved['strategy']))
    if jax.process_index() == 0:
        print(f'resuming from {mngr.directory / str(step)}', file=sys.stderr, flush=True)
    return checkpoint.restore_state(mngr, step, target), step


def run(
    twin,
    strategy: str,
    task: tasks.Task,
    config: cfg.TrainConfig,
    mesh,
    workdir: pathlib.Path,
    sharding=False,
    checkpoint_every=None,
    keep=3,
    save_initial=False,
    cp_layout='zigzag',
    microbatches=4,
    checked=False,
    schedule='gpipe',
    virtual=None,
) -> dict | None:
    """Trains `task` with `twin.STRATEGIES[strategy]` (e.g. auto's dp.py); returns the last line,
    or None when `workdir` already holds step --steps (then nothing is written). Saves a
    checkpoint every `checkpoint_every` steps (default: at each evaluation) and at the end (and
    at step 0 with `save_initial`), and resumes from the latest one in `workdir`, which it locks
    for its lifetime."""
    plan = plans.of(mesh, strategy)
    if not checked:  # the CLI checked before reading the warm-up (mesh_from_flags)
        check_strategy(
            strategy, task.model_config, mesh, config.batch_size, microbatches, cp_layout,
            twin.RING, schedule, virtual,
        )  # fmt: skip
    tx = make_optimizer(config)
    graphdef, state = create_state(task.make_model(nnx.Rngs(config.seed)), tx)
    state = place_state(state, mesh, strategy)
    saved = {
        'model': task.name,
        'model_config': cfg.to_dict(task.model_config),
        'train': cfg.to_dict(config),
        'twin': twin.NAME,
        'strategy': strategy,
        'devices': mesh.size,
        'mesh': dict(mesh.shape),
        **({'cp_layout': cp_layout} if plan.uses(SEQ) else {}),
        **({'microbatches': microbatches} if plan.uses(plans.STAGE) else {}),
        # gpipe's runs record no schedule, as before there was a choice
        **({'pp_schedule': schedule, 'pp_virtual': virtual_stages(schedule, virtual)}
           if schedule != 'gpipe' else {}),
    }  # fmt: skip
    report.ensure_writable(workdir)
    main = jax.process_index() == 0  # with several processes, process 0 writes and prints
    with report.hold_workdir(workdir, main), checkpoint.manager(workdir, keep) as mngr:
        state, start = restore_latest(mngr, state, saved, mesh, config.steps)
        if state is None:
            return None
        if save_initial and start == 0:  # step 0, for python -m tools.bisect RUN_A RUN_B
            checkpoint.save(mngr, state, saved)
        text = json.dumps(saved, indent=2) + '\n'
        if main:
            report.atomic_write(workdir / 'config.json', lambda f: f.write(text.encode()))
        log = report.MetricsLog(workdir / 'metrics.jsonl', resume_from=start, enabled=main)
        loop = Loop(twin, strategy, task, config, mesh, graphdef, tx, log, mngr, saved)
        return loop.run(state, start, checkpoint_every or config.eval_every, sharding, workdir)


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


def default_devices(batch_size: int) -> int:
    """--num_devices; else, when neither --mesh nor --batch_size is given and the default batch
    does not split over every device (the transformer's 12 on 8 emulated CPU devices), the most
    devices it splits over, said in one warning; else every device."""
    given = F.MESH.value or F.TRAIN['batch_size'].value
    n = jax.device_count()
    if F.NUM_DEVICES.value is not None:
        return F.NUM_DEVICES.value
    if given or jax.process_count() > 1 or batch_size % n == 0:
        return n
    fits = max(k for k in range(1, n + 1) if batch_size % k == 0)
    print(
        f'warning: the default --batch_size={batch_size} does not split over {n} devices: '
        f'training on {fits} (give --num_devices, --mesh or --batch_size to choose)',
        file=sys.stderr,
    )
    return fits


def make_task(config):
    if F.DATA_DIR.value and pathlib.Path(F.DATA_DIR.value).is_file():
        raise UsageError(
            f'--data_dir={F.DATA_DIR.value} is a file: give the folder that holds (or will hold) '
            'mnist/ and tinyshakespeare/'
        )
    if F.MODEL.value == 'mlp':
        return tasks.mnist_task(config, F.DATA_DIR.value, F.DOWNLOAD.value)
    return tasks.shakespeare_task(
        config, F.transformer_config(), F.DATA_DIR.value, F.DOWNLOAD.value
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
            sys.exit(f'error: unexpected arguments {argv[1:]}: every setting is a --flag')
        if not flags.FLAGS['verbosity'].present:  # Orbax and XLA log a lot at INFO
            logging.set_verbosity(logging.WARNING)
        if not F.VERBOSE.value:  # a failed save is reported once, by us, in one line
            quiet_failed_save()
            plain_warnings()
        try:
            configure_jax(F.CPU_DEVICES.value, cpu_fma=F.CPU_FMA.value)
            start_processes(
                F.COORDINATOR.value,
                F.NUM_PROCESSES.value,
                F.PROCESS_ID.value,
                F.DISTRIBUTED_AUTO.value,
                F.HEARTBEAT_TIMEOUT.value,
            )
            jax.config.update('jax_debug_nans', F.DEBUG_NANS.value)
            workdir = pathlib.Path(F.WORKDIR.value or f'runs/{twin.NAME}_{F.MODEL.value}')
            # the mesh and what its axes need first: a short --steps's warm-up check after
            devices = default_devices(F.batch_size())
            plan, mesh = mesh_from_flags(twin.AXIS_TYPE, devices, twin.RING, schedules=True)
            F.warn_ignored_flags()
            config = F.train_config(checkpoint.latest_train_config(workdir))
            final = run(
                twin,
                plan.strategy,
                make_task(config),
                config,
                mesh,
                workdir,
                F.SHOW_SHARDING.value,
                F.CHECKPOINT_EVERY.value,
                F.KEEP.value,
                F.SAVE_INITIAL.value,
                F.CP_LAYOUT.value,
                F.MICROBATCHES.value,
                checked=True,
                schedule=F.PP_SCHEDULE.value,
                virtual=F.PP_VIRTUAL.value,
            )
        except FloatingPointError as e:  # raised by JAX's checks under --debug_nans
            if F.VERBOSE.value:
                traceback.print_exc()
            sys.exit(f'error: --debug_nans stopped training at the first NaN: {str(e)[:300]}')
        except (UsageError, DataError, OSError) as e:
            if F.VERBOSE.value:
                traceback.print_exc()
            sys.exit(f'error: {e}')
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
