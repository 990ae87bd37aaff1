"""What the train CLI runs (shard_parity/runtime/train.py): `run` trains a task on a plan with
the twin's file for it (shard_parity/step.py, `strategy_file`), resuming from the workdir's
latest checkpoint. The plan comes checked (shard_parity/runtime/from_flags.py); the step loop
itself is in shard_parity/runtime/loop.py.
"""

import dataclasses
import json
import pathlib
import sys

import jax
from absl import logging
from flax import nnx

from shard_parity import UsageError
from shard_parity import config as cfg
from shard_parity.mesh import mesh_for
from shard_parity.placement import place_state, state_shardings, unsplit
from shard_parity.plan import DATA, SEQ, Plan
from shard_parity.runtime import checkpoint, report, segments, tasks
from shard_parity.runtime.loop import Loop
from shard_parity.runtime.saved import check_compatible
from shard_parity.step import create_state, make_optimizer


@dataclasses.dataclass(frozen=True)
class Outputs:
    """What a run writes besides its metrics: when it saves, how many it keeps, whether it
    saves step 0 (for tools.bisect RUN_A RUN_B), whether it shows where one batch lives."""

    checkpoint_every: int | None = None  # default: at each evaluation
    keep: int = 3
    save_initial: bool = False
    show_sharding: bool = False


def warn_unused_attention(twin, plan: Plan, model_config) -> None:
    """Under 'seq' explicit/ and typed/ run their own ring attention (the twin's RING), and
    ignore --attention=fused: say so."""
    fused = getattr(model_config, 'attention', None) == 'fused'
    if plan.uses(SEQ) and fused and twin.RING:
        logging.warning(
            "--attention=fused is ignored: this twin's %s.py runs its own ring attention in "
            "place of the model's",
            plan.strategy,
        )


def restore_latest(mngr, state, saved: dict, mesh, plan: Plan, steps: int):
    """(state, step): the latest complete checkpoint if this workdir has one, else (state, 0).
    Refuses a checkpoint of other settings, or one beyond --steps."""
    step = mngr.latest_step()
    if step is None:
        return state, 0
    check_compatible(checkpoint.read_config(mngr, step), saved)
    if step > steps:
        raise UsageError(
            f'--steps={steps} is below the newest checkpoint in {mngr.directory} (step {step}): '
            f'--steps is the total, so give --steps={step} or more, or another --workdir'
        )
    if step == steps:
        return None, step  # nothing to do
    target = checkpoint.target_for(state, state_shardings(state, mesh, plan))
    if jax.process_index() == 0:
        print(f'resuming from {mngr.directory / str(step)}', file=sys.stderr, flush=True)
    return checkpoint.restore_state(mngr, step, target), step


def run(twin, plan: Plan, task: tasks.Task, config: cfg.TrainConfig, workdir: pathlib.Path,
        outputs: Outputs = Outputs()) -> dict | None:  # fmt: skip
    """Trains `task` on `plan` (checked) with `twin`'s file for it (e.g. auto's dp.py) on the
    plan's mesh, in the twin's axis types (mesh_for); returns the last line, or None when `workdir`
    already holds step --steps (then nothing is written). Saves a checkpoint every
    `outputs.checkpoint_every` steps (default: at each evaluation) and at the end, and resumes
    from the latest one in `workdir`, which it locks for its lifetime."""
    mesh = mesh_for(plan, twin.AXIS_TYPE)
    tx = make_optimizer(config)
    graphdef, state = create_state(task.make_model(nnx.Rngs(config.seed)), tx)
    state = place_state(state, mesh, plan)
    whole = unsplit(state.params, plan)  # ZeRO-1's arrays with no dimension 'data' divides
    if whole and jax.process_index() == 0:
        print(f"note: ZeRO-1 keeps the moments of {len(whole)} array(s) whole (no dimension "
              f"data:{plan.size(DATA)} divides): {', '.join(whole)}", file=sys.stderr)  # fmt: skip
    saved = {
        'model': task.name,
        'model_config': cfg.to_dict(task.model_config),
        'train': cfg.to_dict(config),
        'twin': twin.NAME,
        **plan.to_config(),
    }
    if checkpoint.finished(workdir, saved, config.steps):  # read-only: nothing to write
        return None
    report.ensure_writable(workdir)
    main = jax.process_index() == 0  # with several processes, process 0 writes and prints
    with report.hold_workdir(workdir, main), checkpoint.manager(workdir, outputs.keep) as mngr:
        state, start = restore_latest(mngr, state, saved, mesh, plan, config.steps)
        if state is None:
            return None
        previous = checkpoint.read_config(mngr, start) if start else None
        saved['segments'] = segments.extend(previous, segments.new(twin.NAME, plan, start, mesh.devices.flat[0]))
        if outputs.save_initial and start == 0:  # step 0, for tools.bisect RUN_A RUN_B
            checkpoint.save(mngr, state, saved)
        text = json.dumps(saved, indent=2) + '\n'
        if main:
            report.atomic_write(workdir / 'config.json', lambda f: f.write(text.encode()))
        log = report.MetricsLog(workdir / 'metrics.jsonl', resume_from=start, enabled=main)
        loop = Loop(twin, plan, task, config, mesh, graphdef, tx, log, mngr, saved)
        every = outputs.checkpoint_every or config.eval_every
        return loop.run(state, start, every, outputs.show_sharding, workdir)
