"""The bug zoo: explicit/dp.py with a partial last window weighted by K, a window of fewer
than K microbatches (a dataset that does not divide) normalised as if all K were there: the
loss divided by K microbatches' worth of tokens rather than by the tokens it holds, as Hugging
Face's loop once divided by gradient_accumulation_steps. Equal on full windows; a window of 3
of 4 microbatches has 3/4 of its loss and gradient: caught at that step, in its loss (the
bisector's forward phase; test_accumulation_zoo.py; the fuzzer draws such windows,
the bisector's --partial_window)."""

import jax
import jax.numpy as jnp

from shard_parity.explicit import dp
from shard_parity.mesh import DATA
from shard_parity.placement import BATCH, REPLICATED
from shard_parity.step import accumulate, as_dtype, bind, microbatches

from . import planted


def by_k(batch, k):
    """The batch's weights as a full window's: x (microbatches present) / K."""
    if 'weight' not in batch:
        return batch
    parts = microbatches(batch['weight'], k).reshape(k, -1)
    present = jnp.sum(jnp.any(parts > 0, axis=1))
    return {**batch, 'weight': batch['weight'] * present / k}


planted(globals(), dp)


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def local(params, batch):  # params: the full arrays; batch: x[B/n, ...], this device's rows
        # Mark the params as varying per device first. Left invariant, `grad` would transpose their
        # implicit broadcast into a psum, and the pmean below would return the sum, n times too big.
        params = jax.lax.pcast(params, DATA, to='varying')
        batch = by_k(batch, getattr(loss_fn, 'steps', 1))  # BUG: the window counted as K full
        # the loss and gradient of the local rows, summed over K microbatches of them (local)
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return jax.lax.pmean((metrics, grads), DATA)  # the all-reduce: average over the 'data' axis

    # the step: `local` on each device's shard (the specs are fixed: nothing to build first)
    fn = jax.shard_map(local, mesh=mesh, in_specs=(REPLICATED, BATCH), out_specs=REPLICATED)
    return jax.jit(fn)
