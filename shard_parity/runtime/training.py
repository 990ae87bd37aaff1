"""What the train CLI runs (shard_parity/runtime/train.py), and the inspector's and the
bisector's checks of a mesh: `run` trains a task with a twin's strategy file, resuming from the
workdir's latest checkpoint; `mesh_from_flags` and `check_strategy` build and check the mesh
before anything compiles. The step loop itself is in shard_parity/runtime/loop.py.
"""

import json
import pathlib
import sys

import jax
from absl import logging
from flax import nnx

from shard_parity import UsageError
from shard_parity import plan as plans
from shard_parity.mesh import SEQ, mesh_for
from shard_parity.pipeline import check_schedule, virtual_stages
from shard_parity.placement import place_state, state_shardings
from shard_parity.runtime import checkpoint, report, segments, tasks
from shard_parity.runtime import config as cfg
from shard_parity.runtime import flags as F
from shard_parity.runtime.loop import Loop
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


def mesh_from_flags(axis_type, devices: int, ring=False, on=None, schedules=False):
    """(plan, mesh) of --mesh and --strategy over `devices` devices, checked before anything
    compiles: the train CLI's, the inspector's and the bisector's. `ring`: as check_strategy's.
    `on`: the devices to build it from (the inspector's --target), default this process's.
    `schedules`: whether the caller runs --pp_schedule's files (the train CLI, the inspector);
    the bisector runs each twin's STRATEGIES, GPipe's pp.py, and refuses another schedule."""
    if not schedules and F.PP_SCHEDULE.value != 'gpipe':
        raise UsageError(
            f'--pp_schedule={F.PP_SCHEDULE.value}: this tool runs the twins\' pp.py (gpipe); '
            'the train CLIs and the inspector run the other schedules, and the bisector takes '
            'their module: --twins=explicit,explicit.pp_1f1b'
        )
    plan = F.plan(devices)
    mesh = mesh_for(plan, axis_type, devices=on)
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
    if checkpoint.finished(workdir, saved, config.steps):  # read-only: nothing to write
        return None
    report.ensure_writable(workdir)
    main = jax.process_index() == 0  # with several processes, process 0 writes and prints
    with report.hold_workdir(workdir, main), checkpoint.manager(workdir, keep) as mngr:
        state, start = restore_latest(mngr, state, saved, mesh, config.steps)
        if state is None:
            return None
        previous = checkpoint.read_config(mngr, start) if start else None
        saved['segments'] = segments.extend(previous, saved, start)  # the plans so far
        if save_initial and start == 0:  # step 0, for python -m tools.bisect RUN_A RUN_B
            checkpoint.save(mngr, state, saved)
        text = json.dumps(saved, indent=2) + '\n'
        if main:
            report.atomic_write(workdir / 'config.json', lambda f: f.write(text.encode()))
        log = report.MetricsLog(workdir / 'metrics.jsonl', resume_from=start, enabled=main)
        loop = Loop(twin, strategy, task, config, mesh, graphdef, tx, log, mngr, saved)
        return loop.run(state, start, checkpoint_every or config.eval_every, sharding, workdir)
