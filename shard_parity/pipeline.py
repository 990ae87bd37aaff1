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
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity import UsageError
from shard_parity.mesh import DATA, STAGE
from shard_parity.model.ops import typed


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
    """[M, b, ...] @ P(None, 'data') -> [M, S, b, ...] @ P(None, 'stage', 'data'): for a buffer
    of S slots (auto/, typed/), microbatch m in slot 0, stage 0's, and zeros in the others. Laid
    out once, before the ticks' loop: each tick's microbatch then enters the buffer with no data
    moved, and their gradient, a sum over the slots, leaves stage 0 in one all-reduce after the
    loop. (`h.at[0].set(x)` at every tick made the compiler sum it over 'stage' at every tick.)"""
    stages, sharding = mesh.shape[STAGE], NamedSharding(mesh, P(None, STAGE, DATA))
    explicit = typed(inputs) is not None  # Explicit mode (typed/): the layout is the type
    xs = jnp.broadcast_to(inputs[:, None], (len(inputs), stages, *inputs.shape[1:]),
                          out_sharding=sharding if explicit else None)  # fmt: skip
    first = (jnp.arange(stages) == 0).reshape(1, stages, *[1] * (xs.ndim - 2))
    xs = jnp.where(first, xs, 0)
    return xs if explicit else jax.lax.with_sharding_constraint(xs, sharding)  # auto/: a hint


def check_pp(model_config, mesh, batch_size: int, microbatches: int) -> None:
    """The stages take equal shares of the layers, and each 'data' device's rows divide into M
    microbatches; the MLP has no stack of equal layers to split."""
    s, d = mesh.shape[STAGE], mesh.shape[DATA]
    if not hasattr(model_config, 'num_layers'):
        raise UsageError(
            '--strategy=pp splits a stack of equal layers into stages, and --model=mlp has '
            'none: use --model=transformer, or another --strategy (dp, fsdp, tp, fsdp_tp)'
        )
    if model_config.num_layers % s:
        raise UsageError(
            f"--num_layers={model_config.num_layers} is not divisible by the mesh's stage axis "
            f'({s}): each stage holds num_layers/{s} consecutive layers; use a multiple of {s}, '
            f'or a --mesh whose second number divides {model_config.num_layers}'
        )
    if microbatches < 1 or batch_size % (d * microbatches):
        raise UsageError(
            f'--batch_size={batch_size} does not split into --microbatches={microbatches} on '
            f"each of the {d} devices of the mesh's data axis: use a --batch_size divisible "
            f'by {d} x {microbatches} = {d * microbatches}'
        )
    if s == 1:
        logging.warning(
            "--strategy=pp on a stage axis of 1 (--mesh=%dx1) makes no pipeline: one stage holds "
            'every layer, and it runs as dp with microbatches; give the second number of --mesh '
            'to split the layers that many ways',
            d,
        )
