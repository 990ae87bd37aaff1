"""Frozen configs: the flags only fill these, and every run saves them beside its outputs."""

import dataclasses

import jax.numpy as jnp

from shard_parity import UsageError


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    """A ReLU multi-layer perceptron classifier for 28x28 MNIST digits."""

    layer_sizes: tuple[int, ...] = (784, 512, 512, 10)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A byte-level causal transformer. Defaults: nanoGPT's shakespeare_char CPU configuration."""

    vocab_size: int = 256
    seq_len: int = 64  # the context: position embeddings exist for this many bytes
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4  # = num_heads: MHA; a divisor: GQA; 1: MQA
    embed_dim: int = 128
    attention: str = 'naive'  # 'naive' or 'fused' (shard_parity/attention.py)
    dtype: str = 'float32'  # compute dtype; parameters stay float32

    def __post_init__(self):
        for name in ('seq_len', 'num_layers', 'num_heads', 'num_kv_heads', 'embed_dim'):
            if getattr(self, name) < 1:
                raise UsageError(f'--{name}={getattr(self, name)} must be at least 1')
        if self.num_heads % self.num_kv_heads:
            raise UsageError(
                f'--num_kv_heads={self.num_kv_heads} does not divide --num_heads='
                f'{self.num_heads}: each key/value head serves a whole group of query heads'
            )
        if self.embed_dim % self.num_heads:
            raise UsageError(
                f'--embed_dim={self.embed_dim} is not divisible by --num_heads={self.num_heads}'
            )

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train: the same values drive the auto, explicit and one-device runs."""

    steps: int = 600
    batch_size: int = 128  # global: split evenly over the mesh's 'data' axis
    learning_rate: float = 1e-3
    weight_decay: float = 1e-4  # AdamW's decoupled decay, on weight matrices only
    beta2: float = 0.999
    warmup_steps: int = 0  # linear warm-up from 0, then cosine decay...
    decay_steps: int | None = None  # ...over this many steps (default: steps)...
    min_learning_rate: float | None = None  # ...down to this (default: constant learning_rate)
    grad_clip: float | None = None  # clip the global norm of the averaged gradient
    seed: int = 0
    log_every: int = 50
    eval_every: int = 200

    def __post_init__(self):
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
