"""How to train: one frozen config, filled by the flags and saved beside every checkpoint.

Each field carries its flag's help and bounds (shard_parity/runtime/flags.py defines one flag
per field from them), so a new hyperparameter is one field here and, where the models differ,
one value in TRAIN_DEFAULTS.
"""

import dataclasses
import math

from shard_parity import UsageError
from shard_parity.model.mlp import MLPConfig  # noqa: F401  (the model configs, saved beside
from shard_parity.model.transformer import TransformerConfig  # noqa: F401  this one)


def _field(default, help: str, lower=None, upper=None):
    return dataclasses.field(
        default=default, metadata={'help': help, 'lower': lower, 'upper': upper}
    )


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The same values drive the auto, explicit and one-device runs."""

    steps: int = _field(600, 'Total training steps.', lower=1)
    batch_size: int = _field(
        128, "Global batch size, split evenly over the mesh's row axes ('data', 'fsdp', 'expert').", 1
    )
    learning_rate: float = _field(1e-3, 'Peak AdamW learning rate.', lower=0.0)
    weight_decay: float = _field(
        1e-4, "AdamW's decoupled decay, on weight matrices only (not biases or norms).", 0.0
    )
    beta2: float = _field(0.999, "AdamW's second-moment decay.", 0.0, 1.0)
    warmup_steps: int = _field(0, 'Linear warm-up steps from 0, then cosine decay.', lower=0)
    decay_steps: int | None = _field(None, 'Cosine decay length (None: --steps).', lower=1)
    min_learning_rate: float | None = _field(
        None, 'Learning rate at the end of the cosine decay (None: constant).', lower=0.0
    )
    grad_clip: float | None = _field(
        None, 'Clip the global norm of the averaged gradient to this (None or 0: off).', 0.0
    )
    seed: int = _field(
        0, 'Seeds the initialisation and the batch order (generate: the sampling).', 0, 2**31 - 1
    )
    gradient_accumulation_steps: int = _field(
        1,
        'K microbatches per optimizer step: each device cuts its rows into K, sums their '
        'gradients in float32, and the twin reduces once (docs/accumulation.md).',
        lower=1,
    )
    variable_length: bool = _field(
        False,
        'Transformer: train on variable-length documents, each window a document of random '
        'length then padding, which the loss mask ignores (the loss is a mean over tokens).',
    )
    log_every: int = _field(50, 'Log the mean train loss every N steps.', lower=1)
    eval_every: int = _field(200, 'Evaluate every N steps (and at the end).', lower=1)
    log_grad_norm: bool = _field(
        False,
        'Log the global norm of the averaged gradient (train_grad_norm in metrics.jsonl), for '
        'python -m tools.bisect RUN_A RUN_B. Under fsdp, tp and cp it adds a scalar '
        'all-reduce per sharded array.',
    )

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise UsageError(f'--{field.name}={value} is not a finite number')
        decay = self.decay_steps or self.steps
        schedule = self.warmup_steps > 0 or self.min_learning_rate not in (None, self.learning_rate)
        if schedule and self.warmup_steps >= decay:
            raise UsageError(
                f'--warmup_steps={self.warmup_steps} must be below the length of the schedule, '
                f'--decay_steps (default: --steps) = {decay}: lower --warmup_steps or raise --steps'
            )


# Per-model defaults of the flags left unset: MNIST as in the reference run of
# ../shared/data/README.md, the transformer as nanoGPT's train_shakespeare_char.py on CPU.
TRAIN_DEFAULTS = {
    'mlp': TrainConfig(),
    'transformer': TrainConfig(
        steps=2000,
        batch_size=12,
        learning_rate=1e-3,
        weight_decay=0.1,
        beta2=0.99,
        warmup_steps=100,
        min_learning_rate=1e-4,
        grad_clip=1.0,
        log_every=100,
        eval_every=500,
    ),
}


def to_dict(config) -> dict:
    return dataclasses.asdict(config)
