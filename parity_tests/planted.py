"""Collectives planted at known lines, for test_inspector.py: each line that must cause one is
marked `# planted: NAME`, and the test asks the inspector which line it names.

- `gather`: an all-gather forced by asking for a replicated array: a sharding constraint in
  Auto mode, a `reshard` in Explicit mode (typed/), an `all_gather` in a shard_map (explicit/);
- `psum`: a psum written in a shard_map, on an Auto and on an Explicit mesh;
- `looped`: the psum inside a scan of 3 steps inside a scan of 4: 12 per call;
- `backward`: a constraint whose transpose gathers the gradient: the all-gather is backward;
- `whole_weight`, `reshard`: surprises: a whole weight gathered, an all-to-all nobody wrote.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

ROWS = P('data')


def gather(mesh, mode: str):
    """x: f32[B, D] @ P('data') -> the whole x on every device."""

    def auto(x):
        return jax.lax.with_sharding_constraint(x * 2, NamedSharding(mesh, P()))  # planted: gather

    def typed(x):
        return jax.reshard(x * 2, NamedSharding(mesh, P()))  # planted: gather

    def explicit(x):
        def body(x):
            return jax.lax.all_gather(x * 2, 'data', tiled=True)  # planted: gather

        # check_vma=False: all_gather's result is the same on every device, as P() says
        return jax.shard_map(body, mesh=mesh, in_specs=ROWS, out_specs=P(), check_vma=False)(x)

    return jax.jit({'auto': auto, 'typed': typed, 'explicit': explicit}[mode])


def psum(mesh):
    def body(x):
        return jax.lax.psum(jnp.sum(x, axis=0), 'data')  # planted: psum

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=ROWS, out_specs=P()))


def looped(mesh):
    def body(x):
        def inner(c, _):
            return c + jax.lax.psum(c, 'data') * 1e-3, None  # planted: looped

        def outer(c, _):
            return jax.lax.scan(inner, c, None, length=3)[0], None

        return jax.lax.scan(outer, x, None, length=4)[0]

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=ROWS, out_specs=ROWS))


def backward(mesh):
    """The forward keeps w sharded; the constraint on the gradient's way back gathers it."""

    def loss(w, x):
        w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, P(None, 'data')))
        return jnp.sum(jnp.tanh(x @ w))  # planted: backward

    return jax.jit(jax.grad(loss))


def whole_weight(mesh):
    """w: f32[D, H] @ P(None, 'data') against a batch-sharded x: the partitioner gathers all of w
    (nobody asked: the placement shards it)."""

    def f(x, w):
        return jnp.tanh(x) @ w  # planted: whole_weight

    return jax.jit(f, out_shardings=NamedSharding(mesh, P(None, 'data')))


def reshard(mesh):
    """A reshape across the sharded rows: the partitioner reshards with an all-to-all."""

    def f(x):
        y = jnp.tanh(x).reshape(16, 64) * 2  # planted: reshard
        return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P(None, 'data')))

    return jax.jit(f)
