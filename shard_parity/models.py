"""The models, in Flax NNX. They know nothing of meshes: each twin decides where the arrays live."""

import jax
from flax import nnx

from shard_parity.config import MLPConfig


class MLP(nnx.Module):
    """784-512-512-10 with ReLU: logits for the ten digit classes."""

    def __init__(self, config: MLPConfig, *, rngs: nnx.Rngs):
        sizes = config.layer_sizes
        self.layers = nnx.List([nnx.Linear(i, o, rngs=rngs) for i, o in zip(sizes[:-1], sizes[1:])])

    def __call__(self, x):  # x: f32[B, 784] -> logits f32[B, 10]
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
        return self.layers[-1](x)
