"""What pipeline parallelism's twins share (<twin>/pp.py): the microbatches and the checks.

A GPipe step on S stages and M microbatches runs M + S - 1 ticks. At tick t stage s works on
microbatch t - s, when 0 <= t - s < M; otherwise it is in the bubble, and works on zeros whose
result no later tick reads (docs/pipeline.md draws the schedule). The rows are dealt into
microbatches round-robin (row r into microbatch r mod M), on the global batch (auto/, typed/) as
on each 'data' device's rows (explicit/): both give microbatch m the same rows, and each
microbatch stays split over 'data' with no data moved.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity.mesh import STAGE
from shard_parity.model.ops import typed
from shard_parity.placement import activations


def split(x, microbatches: int):
    """x: [B, ...] -> [M, B/M, ...]: row r in microbatch r mod M."""
    return x.reshape(-1, microbatches, *x.shape[1:]).swapaxes(0, 1)


def join(ys):
    """[M, B/M, ...] -> [B, ...], `split`'s inverse."""
    return ys.swapaxes(0, 1).reshape(-1, *ys.shape[2:])


def feed(inputs, stages: int):
    """What the first stage takes in at each of GPipe's M + S - 1 ticks: the microbatches
    [M, b, ...], then S - 1 of zeros (bubbles): [M + S - 1, b, ...], the scan's xs. (An index
    into the microbatches at tick t would do too, but under typed/ its transpose trips jax
    0.12: a dynamic_update_slice of a 'data'-split row into an unsplit zero array.)"""
    return jnp.pad(inputs, [(0, stages - 1)] + [(0, 0)] * (inputs.ndim - 1))


def in_first_slot(inputs, mesh):
    """[M, b, ...] @ P(None, 'data') -> [M, S, b, ...] @ P(None, 'stage', 'data') (under the
    composed step its rows' and positions': placement.activations): for a buffer
    of S slots (auto/, typed/), microbatch m in slot 0, stage 0's, and zeros in the others. Laid
    out once, before the ticks' loop: each tick's microbatch then enters the buffer with no data
    moved, and their gradient, a sum over the slots, leaves stage 0 in one all-reduce after the
    loop. (`h.at[0].set(x)` at every tick made the compiler sum it over 'stage' at every tick.)"""
    stages, sharding = mesh.shape[STAGE], NamedSharding(mesh, P(None, STAGE, *activations(mesh)))
    explicit = typed(inputs) is not None  # Explicit mode (typed/): the layout is the type
    xs = jnp.broadcast_to(inputs[:, None], (len(inputs), stages, *inputs.shape[1:]),
                          out_sharding=sharding if explicit else None)  # fmt: skip
    first = (jnp.arange(stages) == 0).reshape(1, stages, *[1] * (xs.ndim - 2))
    xs = jnp.where(first, xs, 0)
    return xs if explicit else jax.lax.with_sharding_constraint(xs, sharding)  # auto/: a hint


def microbatch_means(stats, microbatches: int, stage):
    """A mixture of experts' statistics per tick, {name: [M + S - 1, *stage.shape, k]} (k the
    stage's layers), -> each layer's mean over the M microbatches its stage ran, [*stage.shape,
    k]: stage s holds microbatch t - s at tick t when 0 <= t - s < M; its bubbles' (zeros')
    statistics are left out. `stage`: this device's stage index (explicit/), or every slot's,
    arange(S) (auto/, typed/)."""
    def mean(x):
        ticks = jnp.arange(len(x)).reshape(-1, *[1] * jnp.ndim(stage))
        valid = (ticks >= stage) & (ticks < stage + microbatches)
        return jnp.where(valid[..., None], x, 0).sum(0) / microbatches

    return {name: mean(x) for name, x in stats.items()}
