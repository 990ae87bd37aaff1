"""Orbax checkpoints: the TrainState plus, beside it, the JSON config it was trained with.

    <workdir>/checkpoints/<step>/state   the TrainState (params, optimizer state, step)
    <workdir>/checkpoints/<step>/config  {'model': ..., 'model_config': ..., 'train': ...}

Orbax writes each step into a temporary folder and renames it when complete, so a save killed
half-way never looks like a checkpoint; `latest` only ever sees complete ones. `restore` needs
no flags: it rebuilds the model and optimizer from the saved config and reads the arrays straight
into the shardings the restoring strategy uses on its own mesh (shard_parity/placement.py), so
a checkpoint written by any twin, on any number of devices and under any strategy, restores
into any other twin, mesh and strategy.
"""

import pathlib

import jax
import orbax.checkpoint as ocp
from flax import nnx

from shard_parity import UsageError
from shard_parity.model.mlp import MLP
from shard_parity.model.transformer import Transformer
from shard_parity.placement import state_shardings
from shard_parity.runtime import config as cfg
from shard_parity.step import TrainState, make_optimizer

RESUMABLE = ('steps', 'log_every', 'eval_every')  # train settings a resumed run may change


def manager(workdir, keep: int | None = None, create: bool = True) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        create=create,
        cleanup_tmp_directories=True,
        enable_async_checkpointing=True,  # save() returns once the arrays are copied to host
    )
    folder = pathlib.Path(workdir).absolute() / 'checkpoints'
    return ocp.CheckpointManager(folder, options=options, item_names=('state', 'config'))


def save(mngr: ocp.CheckpointManager, state: TrainState, saved_config: dict) -> None:
    """Starts an asynchronous save; mngr.wait_until_finished() waits for it."""
    # A private copy: the train step donates its input buffers, which must not be the ones
    # Orbax is still reading.
    state = jax.tree.map(lambda x: x.copy(), state)
    args = ocp.args.Composite(
        state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(saved_config)
    )
    try:
        mngr.save(int(state.step), args=args, force=True)
    except OSError as e:  # a full disk, say: the temporary folder is dropped, older ones stay
        raise OSError(
            f'could not save the checkpoint of step {int(state.step)} in '
            f'{mngr.directory} ({e.strerror or e}); the earlier checkpoints are '
            'intact'
        ) from e


def read_config(mngr: ocp.CheckpointManager, step: int) -> dict:
    args = ocp.args.Composite(config=ocp.args.JsonRestore())
    return _guarded(mngr, step, lambda: mngr.restore(step, args=args)['config'])


def restore_state(mngr: ocp.CheckpointManager, step: int, target: TrainState) -> TrainState:
    """Reads step `step` into `target`'s shapes, dtypes and shardings (ShapeDtypeStructs)."""
    args = ocp.args.Composite(state=ocp.args.StandardRestore(target))
    return _guarded(mngr, step, lambda: mngr.restore(step, args=args)['state'])


def _guarded(mngr, step, read):
    try:
        return read()
    except Exception as e:  # tensorstore, JSON and file errors all mean the same to the user
        older = [s for s in mngr.all_steps() if s < step]
        raise UsageError(
            f'checkpoint {mngr.directory / str(step)} is corrupt or truncated '
            f'({type(e).__name__}: {str(e)[:200]}); older checkpoints: {older or "none"}. '
            f'Move it aside to use the newest older one.'
        ) from e


def check_compatible(saved: dict, requested: dict) -> None:
    """Refuses a checkpoint of another model, naming every field that differs."""
    diffs = (
        [f"--model: checkpoint {saved['model']}, requested {requested['model']}"]
        if saved['model'] != requested['model']
        else []
    )
    for group, skip in (('model_config', ()), ('train', RESUMABLE)):
        for key, value in requested[group].items():
            old = saved[group].get(key)
            if key not in skip and _tuples({key: old})[key] != _tuples({key: value})[key]:
                diffs.append(f'--{key}: checkpoint {old}, requested {value}')
    if diffs:
        raise UsageError(
            'the checkpoint in this --workdir was trained with other settings: '
            + '; '.join(diffs)
            + '. Use another --workdir, or the same settings.'
        )


def build_model(saved_config: dict, rngs: nnx.Rngs) -> nnx.Module:
    if saved_config['model'] == 'mlp':
        return MLP(cfg.MLPConfig(**_tuples(saved_config['model_config'])), rngs=rngs)
    return Transformer(cfg.TransformerConfig(**saved_config['model_config']), rngs=rngs)


def _tuples(d: dict) -> dict:  # JSON turns tuples into lists; frozen configs want them back
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


def target_for(state_like, shardings) -> TrainState:
    """ShapeDtypeStructs of `state_like` (arrays or abstract), placed with `shardings` (a tree
    like it, e.g. placement.state_shardings'): where Orbax reads each array to."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state_like, shardings
    )


def restore(workdir, mesh, strategy: str = 'dp', step: int | None = None):
    """(saved config, graphdef, TrainState placed as `strategy` places it on `mesh`)."""
    if not (pathlib.Path(workdir) / 'checkpoints').is_dir():
        raise UsageError(
            f'no checkpoint in {pathlib.Path(workdir) / "checkpoints"}: train '
            f'with --workdir={workdir} first'
        )
    with manager(workdir, create=False) as mngr:
        step = mngr.latest_step() if step is None else step
        if step is None:
            raise UsageError(f'no complete checkpoint in {mngr.directory}')
        saved = read_config(mngr, step)
        tx = make_optimizer(cfg.TrainConfig(**saved['train']))
        graphdef, params = nnx.split(nnx.eval_shape(lambda: build_model(saved, nnx.Rngs(0))))
        abstract = TrainState(
            jax.ShapeDtypeStruct((), 'int32'), params, jax.eval_shape(tx.init, params)
        )
        target = target_for(abstract, state_shardings(abstract, mesh, strategy))
        state = restore_state(mngr, step, target)
    return saved, graphdef, state


def read_numpy(workdir, step: int):
    """(saved config, graphdef, TrainState of numpy arrays) of checkpoint `step`: no mesh, no
    twin. Every array is read whole onto the first device, whatever mesh wrote it."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with manager(workdir, create=False) as mngr:
        saved = read_config(mngr, step)
        tx = make_optimizer(cfg.TrainConfig(**saved['train']))
        graphdef, params = nnx.split(nnx.eval_shape(lambda: build_model(saved, nnx.Rngs(0))))
        abstract = TrainState(
            jax.ShapeDtypeStruct((), 'int32'), params, jax.eval_shape(tx.init, params)
        )
        state = restore_state(
            mngr, step, target_for(abstract, jax.tree.map(lambda _: device, abstract))
        )
    return saved, graphdef, jax.device_get(state)


def steps(workdir) -> list[int]:
    """The complete checkpoints in `workdir`, oldest first."""
    if not (pathlib.Path(workdir) / 'checkpoints').is_dir():
        return []
    with manager(workdir, create=False) as mngr:
        return sorted(mngr.all_steps())
