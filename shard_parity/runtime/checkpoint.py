"""Orbax checkpoints: the TrainState plus, beside it, the JSON config it was trained with.

    <workdir>/checkpoints/<step>/state   the TrainState (params, optimizer state, step)
    <workdir>/checkpoints/<step>/config  {'model': ..., 'model_config': ..., 'train': ...}
    <workdir>/checkpoints/<step>/window  the train figures of each step since the last train
                                         line (shard_parity/runtime/loop.py's averaging window)

Orbax writes each step into a temporary folder and renames it when complete, so a save killed
half-way never looks like a checkpoint; `latest` only ever sees complete ones. Only the trainer,
which holds the workdir's lock (report.hold_workdir), writes: it alone cleans up temporary folders
and drops old steps. Readers (generate, the tests, any tool) open the folder read-only with
`reader`, so they can never delete a save in progress. Every save error, synchronous or from
Orbax's background thread, becomes one SaveError naming the step and the intact ones. Each complete
save gets checksums that every read verifies first (shard_parity/runtime/integrity.py): bit rot is
refused, never loaded. `restore` needs no flags: it rebuilds the model and optimizer from the saved
config and reads the arrays straight into the shardings the restoring strategy uses on its own mesh
(shard_parity/placement.py), so a checkpoint written by any twin, on any number of devices and
under any strategy, restores into any other twin, mesh and strategy.
"""

import pathlib

import jax
import orbax.checkpoint as ocp
from absl import logging

from shard_parity import UsageError
from shard_parity.placement import state_shardings
from shard_parity.runtime import legacy
from shard_parity.runtime.integrity import Damaged, verify, write_checksums
from shard_parity.runtime.saved import abstract_state, check_compatible
from shard_parity.step import TrainState

ITEMS = ('state', 'config', 'window')  # a checkpoint saved before the window has no 'window'


class SaveError(UsageError):
    """A checkpoint could not be written: the run stops, the earlier checkpoints stay."""

    exit_code = 1  # a fault, not a bad input


class Manager(ocp.CheckpointManager):
    """Orbax's manager, with every save error (a full disk, a permission, a missing folder),
    raised at save() or later from the background thread, turned into one SaveError."""

    saving = None  # the step of the save in flight

    def save(self, step, *args, **kwargs):
        self.wait_until_finished()  # a failed background save of the previous step surfaces here
        self.saving = step
        try:
            return super().save(step, *args, **kwargs)
        except Exception as e:
            raise self._failed(step, e) from e

    def wait_until_finished(self):
        try:
            super().wait_until_finished()
        except Exception as e:
            raise self._failed(self.saving, e) from e
        folder = pathlib.Path(self.directory) / str(self.saving)
        if self.saving is not None and jax.process_index() == 0 and folder.is_dir():
            write_checksums(folder)  # once the save is complete (Orbax renamed it into place)

    def reached_preemption(self, step) -> bool:
        """False: the loop asks JAX's preemption sync point itself, after every step. Orbax asked
        it too, from its finalize thread with the step of an older save, which could move JAX's
        record of this process's step back and leave the processes no common step to stop at."""
        return False

    def _failed(self, step, e) -> SaveError:
        text = str(e).split('\n')[0]
        if isinstance(e, OSError) and e.strerror:
            reason = e.strerror
        elif 'RESOURCE_EXHAUSTED' in text or 'No space left' in text:
            reason = 'No space left on device (RESOURCE_EXHAUSTED)'
        else:
            reason = text[:300]
        folders = list(self.directory.iterdir()) if self.directory.is_dir() else []
        intact = sorted(int(p.name) for p in folders if p.name.isdigit() and int(p.name) != step)
        return SaveError(
            f'could not save the checkpoint of step {step}: {reason}; '
            + (
                f'the checkpoints of steps {", ".join(map(str, intact))} are intact'
                if intact
                else 'no earlier checkpoint exists'
            )
        )


def manager(workdir, keep: int | None = None) -> Manager:
    """The trainer's manager: only the process holding the workdir's lock may build one."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        create=True,
        cleanup_tmp_directories=True,  # a killed save's leftovers: safe only under the lock
        enable_async_checkpointing=True,  # save() returns once the arrays are copied to host
    )
    folder = pathlib.Path(workdir).absolute() / 'checkpoints'
    return Manager(folder, options=options, item_names=ITEMS)


# Orbax's notices that say nothing to the user: each reader's read-only folder, and a step's
# missing _CHECKPOINT_METADATA (Orbax goes on without it), which a kill -9 while --keep deleted
# an old step, or a save older than that file, leaves.
ORBAX_NOISE = ('Given directory is read only', 'Metadata file does not exist')


def _not_orbax_noise(record) -> bool:
    return not record.getMessage().startswith(ORBAX_NOISE)


logging.get_absl_logger().addFilter(_not_orbax_noise)


def reader(workdir) -> ocp.CheckpointManager:
    """A read-only manager: it creates, cleans up and deletes nothing, whatever a trainer in
    the same workdir is doing."""
    options = ocp.CheckpointManagerOptions(
        read_only=True,
        create=False,
        cleanup_tmp_directories=False,
        save_interval_steps=0,
        enable_async_checkpointing=False,
    )
    folder = pathlib.Path(workdir).absolute() / 'checkpoints'
    return ocp.CheckpointManager(folder, options=options, item_names=ITEMS)


def latest_train_config(workdir) -> dict | None:
    """The 'train' settings of the newest checkpoint in `workdir`, read-only; None if there is
    none (or it cannot be read: the trainer reports that itself)."""
    if not (pathlib.Path(workdir) / 'checkpoints').is_dir():
        return None
    with reader(workdir) as mngr:
        step = mngr.latest_step()
        try:
            return None if step is None else read_config(mngr, step)['train']
        except UsageError:
            return None


def finished(workdir, saved: dict, steps: int) -> bool:
    """Whether `workdir`'s newest checkpoint is step `steps` of a run of these settings, read
    without writing anything: a finished run in a read-only workdir has nothing to do. Refuses a
    checkpoint of other settings, as resuming would. With several processes each asks: the
    folder of step `steps` is there for all or for none (none is saved before all have joined),
    and only then is Orbax's reader, whose calls are collective, opened by all."""
    if not (pathlib.Path(workdir) / 'checkpoints' / str(steps)).is_dir():
        return False
    with reader(workdir) as mngr:
        step = mngr.latest_step()
        if step != steps:
            return False
        check_compatible(read_config(mngr, step), saved)
        return True


def save(mngr: Manager, state: TrainState, saved_config: dict, window: dict | None = None,
         last: bool = False):  # fmt: skip
    """Starts an asynchronous save; mngr.wait_until_finished() waits for it. Raises SaveError.
    `window`: the loop's averaging window (loop.window_record), so that a resumed run logs the
    very means an undisturbed one does. `last`: no step runs after this save (the end, or a
    stop after SIGTERM), so `state` is saved as it is, without a private copy."""
    state = jax.tree.map(lambda x: _to_save(x, last), state)
    items = dict(state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(saved_config))
    if window is not None:
        items['window'] = ocp.args.JsonSave(window)
    mngr.save(int(state.step), args=ocp.args.Composite(**items), force=True)


def read_config(mngr: ocp.CheckpointManager, step: int) -> dict:
    args = ocp.args.Composite(config=ocp.args.JsonRestore())
    return _guarded(mngr, step, lambda: mngr.restore(step, args=args)['config'])


def _to_save(x: jax.Array, last: bool) -> jax.Array:
    """What Orbax is given of `x`. A private copy, unless `last`: the train step donates its
    input buffers, which must not be the ones Orbax is still reading. With one process, an
    array replicated on every device is given as one device's: Orbax writes one replica anyway,
    but takes in every replica it is given first, and copying all of them (dp's 8 of a large
    state) took longer still: together past a scheduler's grace after SIGTERM (docs/errors.md)."""
    replicated = isinstance(x, jax.Array) and x.is_fully_replicated  # (not a host array)
    if replicated and jax.process_count() == 1 and len(x.sharding.device_set) > 1:
        first = min(x.sharding.device_set, key=lambda d: d.id)
        x = jax.device_put(x, jax.sharding.SingleDeviceSharding(first))  # may share first's buffer
    return x if last else x.copy()


def read_window(mngr: ocp.CheckpointManager, step: int) -> dict | None:
    """The averaging window saved with checkpoint `step` (loop.window_record), or None for a
    checkpoint saved before windows were (the loop then starts an empty one and says so)."""
    if not (pathlib.Path(mngr.directory) / str(step) / 'window').is_dir():
        return None
    args = ocp.args.Composite(window=ocp.args.JsonRestore())
    return _guarded(mngr, step, lambda: mngr.restore(step, args=args)['window'])


def restore_state(mngr: ocp.CheckpointManager, step: int, target: TrainState) -> TrainState:
    """Reads step `step` into `target`'s shapes, dtypes and shardings (ShapeDtypeStructs); a
    transformer's written before its blocks were stacked is converted on read (legacy.py)."""
    if _guarded(mngr, step, lambda: legacy.per_layer(mngr, step)):
        return _guarded(mngr, step, lambda: legacy.restore(mngr, step, target))
    args = ocp.args.Composite(state=ocp.args.StandardRestore(target))
    return _guarded(mngr, step, lambda: mngr.restore(step, args=args)['state'])


def _guarded(mngr, step, read):
    folder = pathlib.Path(mngr.directory) / str(step)
    try:
        damaged = verify(folder)
        if damaged:
            raise Damaged(damaged)
        return read()
    except Exception as e:  # tensorstore, JSON and file errors all mean the same to the user
        older = [s for s in mngr.all_steps() if s < step and not verify(folder.parent / str(s))]
        why = str(e) if isinstance(e, Damaged) else f'{type(e).__name__}: {str(e)[:200]}'
        raise UsageError(
            f'checkpoint {folder} is corrupt or truncated ({why}); intact older checkpoints: '
            f'{older or "none"}. Move it aside to use the newest intact one.'
        ) from e


def target_for(state_like, shardings) -> TrainState:
    """ShapeDtypeStructs of `state_like` (arrays or abstract), placed with `shardings` (a tree
    like it, e.g. placement.state_shardings'): where Orbax reads each array to."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state_like, shardings
    )


def restore(workdir, mesh, plan=None, step: int | None = None):
    """(saved config, graphdef, TrainState placed as `plan` places it on `mesh`, or whole on
    every device of `mesh` without a plan): step `step`, or the newest complete one; if a
    trainer's --keep deletes that one while it is read, the next newest."""
    if not (pathlib.Path(workdir) / 'checkpoints').is_dir():
        raise UsageError(
            f'no checkpoint in {pathlib.Path(workdir) / "checkpoints"}: train '
            f'with --workdir={workdir} first'
        )
    with reader(workdir) as mngr:
        steps = [step] if step is not None else sorted(mngr.all_steps(), reverse=True)
        if not steps:
            raise UsageError(f'no complete checkpoint in {mngr.directory}')
        for s in steps:
            try:
                return _restore_step(mngr, s, mesh, plan)
            except UsageError:
                if (mngr.directory / str(s)).exists() or s == steps[-1]:
                    raise  # corrupt, not deleted under us
    raise AssertionError('unreachable')


def _restore_step(mngr, step: int, mesh, plan):
    saved = read_config(mngr, step)
    graphdef, abstract = abstract_state(saved)
    whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    shardings = jax.tree.map(lambda _: whole, abstract) if plan is None else None
    target = target_for(abstract, shardings or state_shardings(abstract, mesh, plan))
    return saved, graphdef, restore_state(mngr, step, target)


def read_numpy(workdir, step: int):
    """(saved config, graphdef, TrainState of numpy arrays) of checkpoint `step`: no mesh, no
    twin. Every array is read whole onto the first device, whatever mesh wrote it."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with reader(workdir) as mngr:
        saved = read_config(mngr, step)
        graphdef, abstract = abstract_state(saved)
        target = target_for(abstract, jax.tree.map(lambda _: device, abstract))
        state = restore_state(mngr, step, target)
    return saved, graphdef, jax.device_get(state)


def steps(workdir) -> list[int]:
    """The complete checkpoints in `workdir`, oldest first."""
    if not (pathlib.Path(workdir) / 'checkpoints').is_dir():
        return []
    with reader(workdir) as mngr:
        return sorted(mngr.all_steps())
