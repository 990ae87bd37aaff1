"""Orbax checkpoints: the TrainState plus, beside it, the JSON config it was trained with.

    <workdir>/checkpoints/<step>/state   the TrainState (params, optimizer state, step)
    <workdir>/checkpoints/<step>/config  {'model': ..., 'model_config': ..., 'train': ...}

`restore` needs no flags: it rebuilds the model and optimizer from the saved config, and reads
the arrays straight into the shardings that the caller's twin gives them on the caller's mesh,
so a checkpoint written by one twin, on any number of devices, restores into the other.
"""

import pathlib

import jax
import orbax.checkpoint as ocp
from flax import nnx

from shard_parity import UsageError
from shard_parity import config as cfg
from shard_parity.step import TrainState, make_optimizer


def manager(workdir: pathlib.Path, **options) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(
        pathlib.Path(workdir).absolute() / 'checkpoints',
        options=ocp.CheckpointManagerOptions(**options),
        item_names=('state', 'config'),
    )


def save(workdir: pathlib.Path, state: TrainState, saved_config: dict) -> None:
    with manager(workdir) as mngr:
        mngr.save(
            int(state.step),
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(saved_config)
            ),
        )
        mngr.wait_until_finished()


def build_model(saved_config: dict, rngs: nnx.Rngs) -> nnx.Module:
    from shard_parity.models import MLP
    from shard_parity.transformer import Transformer

    if saved_config['model'] == 'mlp':
        return MLP(cfg.MLPConfig(**_tuples(saved_config['model_config'])), rngs=rngs)
    return Transformer(cfg.TransformerConfig(**saved_config['model_config']), rngs=rngs)


def _tuples(d: dict) -> dict:  # JSON turns tuples into lists; frozen configs want them back
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


def restore(workdir: pathlib.Path, twin, mesh, step: int | None = None):
    """(saved config, graphdef, TrainState placed as `twin` places it on `mesh`)."""
    folder = pathlib.Path(workdir) / 'checkpoints'
    with manager(workdir, create=False) as mngr:
        step = mngr.latest_step() if folder.is_dir() and step is None else step
        if step is None:
            raise UsageError(f'no checkpoint in {folder}: train with --workdir={workdir} first')
        saved = mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))['config']
        train_config = cfg.TrainConfig(**saved['train'])
        tx = make_optimizer(train_config)
        model = nnx.eval_shape(lambda: build_model(saved, nnx.Rngs(0)))
        graphdef, params = nnx.split(model)
        abstract = TrainState(
            jax.ShapeDtypeStruct((), 'int32'), params, jax.eval_shape(tx.init, params)
        )
        # The target: this twin's placement of the state (replicated) on the caller's mesh.
        sharding = jax.sharding.NamedSharding(mesh, twin.REPLICATED)
        target = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), abstract
        )
        state = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
    return saved, graphdef, state['state']
