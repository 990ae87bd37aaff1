"""explicit/composed.py under ZeRO-1 (--shard_optimizer_over_data) with the update run inside
shard_map, each device on its own shards: optax's clip_by_global_norm there takes the norm of the
local 1/n of the gradient, not of the whole (the global norm needs a psum of the shards' sums of
squares). With --grad_clip each device scales its shard by its own factor (the bug zoo). Caught
at the first step whose norm is clipped, phase update (test_zero1.py). It runs the update per
device wherever the update is split, so an fsdp or 'model' mesh without ZeRO-1 shows it too
(the fuzzer's shrinking finds that: test_fuzz.py)."""

import jax
import optax
from jax.sharding import PartitionSpec as P

from shard_parity.explicit import composed, zero1
from shard_parity.explicit.composed import loss_and_grads
from shard_parity.placement import update_specs
from shard_parity.step import make_train_step

from . import planted


def per_device(tx, mesh, plan):
    """`tx` with its update run by shard_map on each device's shards (as update_specs splits
    the gradients and the moments; a scalar such as AdamW's count whole)."""

    def update(grads, state, params=None):
        specs = update_specs(grads, plan, mesh)
        states = optax.tree_map_params(tx, lambda _, s: s, state, specs,
                                       transform_non_params=lambda _: P())  # fmt: skip
        local = jax.shard_map(tx.update, mesh=mesh, in_specs=(specs, states, specs),
                              out_specs=(specs, states), check_vma=False)  # fmt: skip
        return local(grads, state, params)

    return optax.GradientTransformation(tx.init, update)


planted(globals(), composed)


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates the shards it holds
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)
    tx = per_device(tx, mesh, plan)  # BUG: the update in shard_map: each clip sees its shard only
    return make_train_step(grads_fn, tx, mesh, plan, gather=zero1.gather)
