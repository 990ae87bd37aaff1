"""ZeRO-1 in JAX's Explicit mode (--shard_optimizer_over_data, docs/zero1.md): AdamW's moments
split over 'data', the parameters whole. The types say it:

    scatter   (none here) the gradient, `unreduced` over 'data', resharded to the moments'
              layout (typed/composed.py): f32[784@data, 512], a reduce-scatter
    gather    the updated params f32[784@data, 512] resharded to f32[784, 512]: an all-gather

Between them the shared update (shard_parity/step.py, make_train_step) runs on the shards.
Compare explicit/zero1.py, where both are collectives, and auto/zero1.py.
"""

import jax

from shard_parity.placement import state_shardings


def gather(params, mesh, plan):
    """The params whole on every 'data' device again: the reshard is the all-gather."""
    return jax.reshard(params, state_shardings(params, mesh, plan))
