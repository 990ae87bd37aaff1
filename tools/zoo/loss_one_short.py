"""explicit/dp.py with each device's loss averaged over one position too few: the per-device
sum of the next-byte losses divided by B x (T - 1) where B x T belongs (the bug zoo). A bug of
6% at T = 16 (1 / (T - 1)), which a bf16 run's gradients hide within their round-off: the loss's
budget, a mean over B x T terms, is far tighter (docs/numerics.md)."""

import jax

from shard_parity.explicit import dp
from shard_parity.mesh import DATA
from shard_parity.placement import BATCH, REPLICATED
from shard_parity.step import accumulate, as_dtype, bind

from . import planted


def one_short(loss_fn):
    """`loss_fn`'s mean over positions as sum / (T - 1): the loss and its metrics x T / (T - 1)."""

    def loss(model, batch):
        value, metrics = loss_fn(model, batch)
        t = batch['y'].shape[-1]
        return value * t / (t - 1), jax.tree.map(lambda m: m * t / (t - 1), metrics)

    return loss


planted(globals(), dp)


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    grad_fn = jax.value_and_grad(bind(graphdef, one_short(loss_fn)), has_aux=True)  # BUG: T - 1

    def local(params, batch):  # params: the full arrays; batch: x[B/n, ...], this device's rows
        # Mark the params as varying per device first. Left invariant, `grad` would transpose their
        # implicit broadcast into a psum, and the pmean below would return the sum, n times too big.
        params = jax.lax.pcast(params, DATA, to='varying')
        # the loss and gradient of the local rows, summed over K microbatches of them (local)
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return jax.lax.pmean((metrics, grads), DATA)  # the all-reduce: average over the 'data' axis

    # the step: `local` on each device's shard (the specs are fixed: nothing to build first)
    fn = jax.shard_map(local, mesh=mesh, in_specs=(REPLICATED, BATCH), out_specs=REPLICATED)
    return jax.jit(fn)
