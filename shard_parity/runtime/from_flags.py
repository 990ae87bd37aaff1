"""What the flags make: the plan of --mesh and --strategy, the model's and the training's
configurations, read from the flags shard_parity/runtime/flags.py defines (and still readable
there by these names). The train CLI, the inspector and the bisector call them after parsing.
"""

import dataclasses

from absl import flags, logging

from shard_parity import UsageError
from shard_parity import plan as plans
from shard_parity.runtime import config as cfg
from shard_parity.runtime.flags import (
    ATTENTION,
    CAPACITY_FACTOR,
    DTYPE,
    EMBED_DIM,
    EXPERTS_PER_TOKEN,
    MESH,
    MODEL,
    NUM_DEVICES,
    NUM_EXPERTS,
    NUM_HEADS,
    NUM_KV_HEADS,
    NUM_LAYERS,
    SEQ_LEN,
    STRATEGY,
    TRAIN,
    TRANSFORMER_SHAPE,
)


def plan(devices: int) -> plans.Plan:
    """--mesh and --strategy as a plan (shard_parity/plan.py) over `devices` devices: a named
    mesh's sizes multiply to that; AxB gives --strategy's two axes (at most that many)."""
    strategy = STRATEGY.value if flags.FLAGS[STRATEGY.name].present else None
    experts = MODEL.value == 'transformer' and NUM_EXPERTS.value > 0
    result = plans.parse(MESH.value, strategy, devices, experts)
    if MESH.value and NUM_DEVICES.value is not None and NUM_DEVICES.value != result.devices:
        raise UsageError(
            f'--num_devices={NUM_DEVICES.value} and --mesh={MESH.value} '
            f'({result.devices} devices) disagree: give one of them'
        )
    return result


def batch_size() -> int:
    """--batch_size, or the model's default."""
    return TRAIN['batch_size'].value or cfg.TRAIN_DEFAULTS[MODEL.value].batch_size


def model_config():
    """The model's configuration from the flags: the transformer's shape, or the MLP's."""
    return transformer_config() if MODEL.value == 'transformer' else cfg.MLPConfig()


def train_config(resumed: dict | None = None) -> cfg.TrainConfig:
    """The model's defaults, overridden by every training flag given. The transformer warms up
    for min(100, steps // 10) steps unless told: nanoGPT's 100 at its 2000 steps, and a short
    run such as --steps=30 still has a schedule; a run resuming checkpoint `resumed` (its
    'train' settings) keeps that run's warm-up whatever --steps is now. The MLP's recipe has
    no warm-up."""
    changes = {name: f.value for name, f in TRAIN.items() if f.value is not None}
    if MODEL.value == 'transformer' and 'warmup_steps' not in changes:
        steps = changes.get('steps', cfg.TRAIN_DEFAULTS['transformer'].steps)
        changes['warmup_steps'] = (resumed or {}).get('warmup_steps', min(100, steps // 10))
    return dataclasses.replace(cfg.TRAIN_DEFAULTS[MODEL.value], **changes)


def warn_ignored_flags() -> None:
    """One warning for transformer flags given with --model=mlp: they would change nothing."""
    given = [f'--{h.name}' for h in TRANSFORMER_SHAPE if flags.FLAGS[h.name].present]
    if MODEL.value == 'mlp' and given:
        logging.warning('%s only shape the transformer: --model=mlp ignores them', ', '.join(given))


def transformer_config() -> cfg.TransformerConfig:
    return cfg.TransformerConfig(
        seq_len=SEQ_LEN.value,
        num_layers=NUM_LAYERS.value,
        num_heads=NUM_HEADS.value,
        num_kv_heads=NUM_KV_HEADS.value or NUM_HEADS.value,
        embed_dim=EMBED_DIM.value,
        attention=ATTENTION.value,
        dtype=DTYPE.value,
        num_experts=NUM_EXPERTS.value,
        experts_per_token=EXPERTS_PER_TOKEN.value,
        capacity_factor=CAPACITY_FACTOR.value,
    )
