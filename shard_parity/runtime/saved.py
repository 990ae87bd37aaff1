"""What a checkpoint's saved config says (shard_parity/runtime/checkpoint.py writes it beside
every state): the model and optimizer it builds, with no flags, and the settings a run that
resumes from it must share with it.
"""

import jax
from flax import nnx

from shard_parity import UsageError
from shard_parity import config as cfg
from shard_parity.model.mlp import MLP
from shard_parity.model.transformer import Transformer
from shard_parity.step import TrainState, make_optimizer

RESUMABLE = ('steps', 'log_every', 'eval_every')  # train settings a resumed run may change
# the precision policy: the state is float32 whatever the compute and reduce dtypes, so a run
# resumes under another policy as it does on another mesh (config.json records each); and the
# remat policy, which changes what a step keeps, not the state
POLICY = ('dtype', 'reduce_dtype', 'remat_policy')

DEFAULTS = {
    'model_config': cfg.to_dict(cfg.TransformerConfig()),  # fields added since (num_experts)
    'train': cfg.to_dict(cfg.TrainConfig()),
}


def check_compatible(saved: dict, requested: dict) -> None:
    """Refuses a checkpoint of another model, naming every field that differs."""
    diffs = (
        [f"--model: checkpoint {saved['model']}, requested {requested['model']}"]
        if saved['model'] != requested['model']
        else []
    )
    for group, skip in (('model_config', POLICY), ('train', RESUMABLE)):
        for key, value in requested[group].items():
            old = saved[group].get(
                key, DEFAULTS[group].get(key)
            )  # a field added since: its default
            if key not in skip and tupled(old) != tupled(value):
                diffs.append(f'--{key}: checkpoint {old}, requested {value}')
    if diffs:
        raise UsageError(
            'the checkpoint in this --workdir was trained with other settings: '
            + '; '.join(diffs)
            + '. Use another --workdir, or the same settings.'
        )


def build_model(saved_config: dict, rngs: nnx.Rngs) -> nnx.Module:
    if saved_config['model'] == 'mlp':
        return MLP(cfg.MLPConfig(**tuples(saved_config['model_config'])), rngs=rngs)
    return Transformer(cfg.TransformerConfig(**saved_config['model_config']), rngs=rngs)


def tupled(value):
    """A JSON list as the tuple a frozen config holds (JSON turns tuples into lists); any other
    value as it is."""
    return tuple(value) if isinstance(value, list) else value


def tuples(d: dict) -> dict:
    return {k: tupled(v) for k, v in d.items()}


def abstract_state(saved: dict):
    """(graphdef, TrainState of ShapeDtypeStructs) of the model and optimizer a config builds."""
    tx = make_optimizer(cfg.TrainConfig(**saved['train']))
    graphdef, params = nnx.split(nnx.eval_shape(lambda: build_model(saved, nnx.Rngs(0))))
    abstract = TrainState(
        jax.ShapeDtypeStruct((), 'int32'), params, jax.eval_shape(tx.init, params)
    )
    return graphdef, abstract
