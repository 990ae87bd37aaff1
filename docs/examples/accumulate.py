"""The inspector's worked example (docs/inspector.md): gradient accumulation over 4 microbatches
of a batch split over 8 devices, written twice. `accumulate` lets the compiler place the
gradient's all-reduce, and it puts one in every microbatch; `accumulate_once` sums each
device's microbatch gradients locally (a shard_map) and all-reduces once, after the loop.

    PYTHONPATH=docs/examples python -m inspector --program=accumulate:build \
        --cpu_devices=8
    PYTHONPATH=docs/examples python -m inspector --program=accumulate:build_fixed \
        --cpu_devices=8
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

MICRO = 4  # microbatches per step


def loss(w, x, y):
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)


def microbatches(a):  # a[B, D] -> [MICRO, B/MICRO, D]: every 4th row, so no row changes device
    return a.reshape(a.shape[0] // MICRO, MICRO, *a.shape[1:]).swapaxes(0, 1)


def mean_grad(w, x, y):
    def add(g, xy):
        return g + jax.grad(loss)(w, *xy), None

    g, _ = jax.lax.scan(add, jnp.zeros_like(w), (microbatches(x), microbatches(y)))
    return g / MICRO


def accumulate(w, x, y):  # w @ P(), x and y @ P('data'): the compiler places the all-reduce
    return mean_grad(w, x, y)


def accumulate_once(mesh, pcast=True):
    def local(w, x, y):  # this device's rows only: its partial gradient, then one all-reduce
        if pcast:  # w differs per device from here on, so grad adds no psum of its own
            w = jax.lax.pcast(w, 'data', to='varying')
        return jax.lax.pmean(mean_grad(w, x, y), 'data')

    data = P('data')
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), data, data), out_specs=P())


def arguments(mesh):
    def arg(shape, spec):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))

    return arg((512, 512), P()), arg((256, 512), P('data')), arg((256, 512), P('data'))


def build():
    """(jitted step, its abstract arguments), as --program asks."""
    mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
    return jax.jit(accumulate), arguments(mesh)


def build_fixed(pcast=True):
    mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
    return jax.jit(accumulate_once(mesh, pcast)), arguments(mesh)


def build_without_pcast():  # the first attempt at the fix (docs/inspector.md)
    return build_fixed(pcast=False)
