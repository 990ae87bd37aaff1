"""What the flags make: the plan (shard_parity/plan.py), the model's and the training's
configurations. The one module that reads the values of the flags shard_parity/runtime/flags.py
defines; the train CLI, the inspector, the bisector and the benchmarks call it after parsing.

The plan is built here once, from --mesh, --strategy, --num_devices, --microbatches,
--pp_schedule, --pp_virtual, --cp_layout, --shard_optimizer_over_data and the precision
flags, and checked
(shard_parity/checks.py) before anything compiles; everything after takes it whole.
"""

import dataclasses
import sys

import jax
from absl import flags, logging

from shard_parity import UsageError, checks, mesh
from shard_parity import config as cfg
from shard_parity import plan as plans
from shard_parity.step import check_accumulation
from shard_parity.runtime.flags import (
    ATTENTION,
    CAPACITY_FACTOR,
    CP_LAYOUT,
    DTYPE,
    EMBED_DIM,
    EXPERTS_PER_TOKEN,
    MATMUL_PRECISION,
    MESH,
    MICROBATCHES,
    MODEL,
    NUM_DEVICES,
    NUM_EXPERTS,
    NUM_HEADS,
    NUM_KV_HEADS,
    NUM_LAYERS,
    PP_SCHEDULE,
    PP_VIRTUAL,
    REDUCE_DTYPE,
    REMAT_POLICY,
    SEQ_LEN,
    SHARD_OPTIMIZER,
    STRATEGY,
    TRAIN,
    TRANSFORMER_SHAPE,
)


def plan(fit_default_batch: bool = False, devices=None) -> plans.Plan:
    """The flags' plan over at most the `devices` (default this process's; a --target's),
    checked: a named mesh's sizes multiply to --num_devices (default: all of them); AxB gives
    --strategy's two axes. `fit_default_batch` (the train CLI): with neither --mesh nor
    --batch_size given, the most devices the default batch splits over (`device_count`)."""
    target = devices is not None
    devices = jax.devices() if devices is None else list(devices)
    if NUM_DEVICES.value is not None and NUM_DEVICES.value > len(devices):
        raise UsageError(mesh.too_many(f'--num_devices={NUM_DEVICES.value}', devices, target))
    count = device_count(len(devices), fit_default_batch)
    strategy = STRATEGY.value if flags.FLAGS[STRATEGY.name].present else None
    experts = MODEL.value == 'transformer' and NUM_EXPERTS.value > 0
    result = plans.parse(
        MESH.value, strategy, count, experts,
        microbatches=MICROBATCHES.value, schedule=PP_SCHEDULE.value, virtual=PP_VIRTUAL.value,
        layout=CP_LAYOUT.value, precision=precision(), zero1=SHARD_OPTIMIZER.value,
    )  # fmt: skip
    if MESH.value and NUM_DEVICES.value is not None and NUM_DEVICES.value != result.devices:
        raise UsageError(
            f'--num_devices={NUM_DEVICES.value} and --mesh={MESH.value} '
            f'({result.devices} devices) disagree: give one of them'
        )
    checks.check(result, model_config(), batch_size())
    check_accumulation(result, batch_size(), TRAIN['gradient_accumulation_steps'].value or 1)
    return result


def device_count(available: int, fit_default_batch: bool = False) -> int:
    """--num_devices; else, with `fit_default_batch`, when neither --mesh nor --batch_size is
    given and the default batch does not split over every device (the transformer's 12 on 8
    emulated CPU devices), the most devices it splits over, said in one warning; else all."""
    if NUM_DEVICES.value is not None:
        return NUM_DEVICES.value
    size = batch_size()
    if not fit_default_batch or MESH.value or TRAIN['batch_size'].value or size % available == 0:
        return available
    fits = max(k for k in range(1, available + 1) if size % k == 0)
    print(
        f'warning: the default --batch_size={size} does not split over {available} devices: '
        f'training on {fits} (give --num_devices, --mesh or --batch_size to choose)',
        file=sys.stderr,
    )
    return fits


def precision() -> plans.Precision:
    """The precision policy (docs/numerics.md): --dtype, --reduce_dtype, --matmul_precision;
    the master parameters float32."""
    return plans.Precision(
        compute=DTYPE.value, reduce=REDUCE_DTYPE.value, matmul=MATMUL_PRECISION.value
    )


def batch_size() -> int:
    """--batch_size, or the model's default."""
    return TRAIN['batch_size'].value or cfg.TRAIN_DEFAULTS[MODEL.value].batch_size


def model_config():
    """The model's configuration from the flags: the transformer's shape, or the MLP's; each
    with the policy's compute and reduce dtypes. The MLP has no blocks to checkpoint: a
    --remat_policy other than none is refused."""
    if MODEL.value == 'transformer':
        return transformer_config()
    if REMAT_POLICY.value not in (None, 'none'):
        raise UsageError(
            f'--remat_policy={REMAT_POLICY.value} checkpoints transformer blocks; --model=mlp '
            'has none (allowed: none, or leave it unset)'
        )
    return cfg.MLPConfig(dtype=DTYPE.value, reduce_dtype=REDUCE_DTYPE.value)


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
        verb = 'shapes' if len(given) == 1 else 'shape'
        logging.warning(
            '%s only %s the transformer: --model=mlp ignores them', ', '.join(given), verb
        )


def transformer_config() -> cfg.TransformerConfig:
    return cfg.TransformerConfig(
        seq_len=SEQ_LEN.value,
        num_layers=NUM_LAYERS.value,
        num_heads=NUM_HEADS.value,
        num_kv_heads=NUM_KV_HEADS.value or NUM_HEADS.value,
        embed_dim=EMBED_DIM.value,
        attention=ATTENTION.value,
        dtype=DTYPE.value,
        reduce_dtype=REDUCE_DTYPE.value,
        num_experts=NUM_EXPERTS.value,
        experts_per_token=EXPERTS_PER_TOKEN.value,
        capacity_factor=CAPACITY_FACTOR.value,
        remat_policy=REMAT_POLICY.value,
    )
