"""The models, in Flax NNX. They know nothing of meshes: each twin decides where the arrays live.

One hook serves explicit tensor parallelism (explicit/tp.py): a module's `sum_partials`, None
unless that twin sets it to its psum over 'model'. A row-parallel layer's output is then each
device's partial sum, and `linear` adds them (the all-reduce) before the bias goes on, once.
"""

import jax
from flax import nnx

from shard_parity.config import MLPConfig
from shard_parity.matmul import dot_general, product
from shard_parity.placement import MLP_PLAN


def linear(layer: nnx.Linear, x, sum_partials=None):
    """layer(x); with `sum_partials`, x and the layer's input rows are split over devices."""
    if sum_partials is None:
        return layer(x)
    if layer.bias is None:
        return sum_partials(layer(x))
    return sum_partials(product(x, layer.kernel[...])) + layer.bias[...]


class MLP(nnx.Module):
    """784-512-512-10 with ReLU: logits for the ten digit classes."""

    def __init__(self, config: MLPConfig, *, rngs: nnx.Rngs):
        sizes = config.layer_sizes
        self.layers = nnx.List(
            [
                nnx.Linear(i, o, dot_general=dot_general, rngs=rngs)
                for i, o in zip(sizes[:-1], sizes[1:])
            ]
        )
        self.sum_partials = None  # set by explicit/tp.py: see the module docstring

    def __call__(self, x):  # x: f32[B, 784] -> logits f32[B, 10]
        for i, layer in enumerate(self.layers[:-1]):
            row = MLP_PLAN.get(i) == 'row'
            x = jax.nn.relu(linear(layer, x, self.sum_partials if row else None))
        return self.layers[-1](x)
