"""The MNIST classifier, in Flax NNX. It knows nothing of meshes: each twin places its arrays.

Tensor parallelism splits its first hidden layer by columns and its second by rows (the
placement's rule, TP_PLAN below). The tensor-parallel steps of explicit/ (a psum over 'model')
and typed/ (a reshard of the `unreduced` sums) pass theirs into the call as `sum_partials`, and
`linear` adds the row-parallel layer's partial sums with it before the bias goes on, once.
auto/ and the strategies without 'model' leave it None.
"""

import dataclasses

import jax
from flax import nnx

from shard_parity.model.ops import Dot, product

TP_PLAN = {0: 'column', 1: 'row'}  # 784-512 column-parallel, 512-512 row-parallel, 512-10 whole


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    """A ReLU multi-layer perceptron classifier for 28x28 MNIST digits."""

    layer_sizes: tuple[int, ...] = (784, 512, 512, 10)
    dtype: str = 'float32'  # compute dtype (--dtype); parameters stay float32
    reduce_dtype: str = 'float32'  # each weight gradient's, as its dot forms it (--reduce_dtype)


def linear(layer: nnx.Linear, x, sum_partials=None):
    """layer(x); with `sum_partials`, x and the layer's kernel rows are this device's share, and
    the product is a partial sum that `sum_partials` adds over devices, before the bias goes on
    once. Either way in the layer's compute dtype, its weight gradient in the layer's (Dot's)."""
    if sum_partials is None:
        return layer(x)
    if layer.bias is None:
        return sum_partials(layer(x))
    dtype = layer.dtype or x.dtype  # as layer(x) casts its operands
    y = product(x.astype(dtype), layer.kernel[...].astype(dtype), grad=layer.dot_general.grad)
    return sum_partials(y) + layer.bias[...].astype(dtype)


class MLP(nnx.Module):
    """784-512-512-10 with ReLU: logits for the ten digit classes."""

    def __init__(self, config: MLPConfig, *, rngs: nnx.Rngs):
        sizes = config.layer_sizes
        self.layers = nnx.List(
            [
                nnx.Linear(i, o, dtype=config.dtype, rngs=rngs,
                           dot_general=Dot(config.reduce_dtype, logits=k == len(sizes) - 2))
                for k, (i, o) in enumerate(zip(sizes[:-1], sizes[1:]))
            ]
        )

    def __call__(self, x, sum_partials=None):  # x: f32[B, 784] -> logits f32[B, 10]
        for i, layer in enumerate(self.layers[:-1]):
            row = TP_PLAN.get(i) == 'row'
            x = jax.nn.relu(linear(layer, x, sum_partials if row else None))
        return self.layers[-1](x)  # float32 logits whatever the compute dtype (Dot's `logits`)
