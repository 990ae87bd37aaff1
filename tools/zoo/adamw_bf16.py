"""explicit/dp.py with AdamW's state kept in bfloat16 where the policy keeps it in float32 (the
bug zoo): each moment rounded to bf16 as it is stored. Its numbers sit within a bf16 run's
round-off (the moments are rounded relative 2^-9, as a bf16 gradient is); the bisector catches
it by the state's element types, which the policy fixes whatever --dtype says
(docs/numerics.md)."""

import jax.numpy as jnp
import optax

from shard_parity.explicit import dp
from shard_parity.explicit.dp import loss_and_grads
from shard_parity.step import as_dtype, make_train_step

from . import planted


def stored_in_bf16(tx):
    """`tx` whose state is rounded to bfloat16 as it is stored (its updates as `tx` makes them)."""

    def update(updates, state, params=None):
        updates, state = tx.update(updates, state, params)
        return updates, as_dtype(state, jnp.bfloat16)

    return optax.GradientTransformation(tx.init, update)


planted(globals(), dp)


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: the same on every device (replicated)
    tx = stored_in_bf16(tx)  # BUG: AdamW's moments in bf16
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)
