"""Frozen configs: the flags only fill these, and every run saves them beside its outputs."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    """A ReLU multi-layer perceptron classifier for 28x28 MNIST digits."""

    layer_sizes: tuple[int, ...] = (784, 512, 512, 10)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train: the same values drive the auto, explicit and one-device runs."""

    steps: int = 600
    batch_size: int = 128  # global: split evenly over the mesh's 'data' axis
    learning_rate: float = 1e-3
    weight_decay: float = 1e-4  # AdamW's decoupled decay, on weight matrices only
    seed: int = 0
    log_every: int = 50
    eval_every: int = 200


def to_dict(config) -> dict:
    return dataclasses.asdict(config)
