"""ZeRO-1 the compiler writes (--shard_optimizer_over_data, docs/zero1.md): AdamW's moments
split over 'data', the parameters whole. We only say where the arrays live:

    scatter   (none here) the gradient asked for in the moments' layout, update_specs: P('data')
              on one dimension; XLA reduces it over 'data' to each device's 1/n (auto/composed.py)
    gather    the updated params asked for in their own layout, P() over 'data': XLA all-gathers

Between them the shared update (shard_parity/step.py, make_train_step) runs on the shards.
Compare explicit/zero1.py, where both are collectives, and typed/zero1.py.
"""

import jax

from shard_parity.placement import state_shardings


def gather(params, mesh, plan):
    """The params whole on every 'data' device again: XLA inserts the all-gather."""
    return jax.lax.with_sharding_constraint(params, state_shardings(params, mesh, plan))
