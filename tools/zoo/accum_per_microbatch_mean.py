"""The bug zoo: explicit/dp.py with --gradient_accumulation_steps' loss averaged per
microbatch, each microbatch's loss divided by its own token count and the K means averaged,
where the step's loss is the sum over all its real tokens divided by their count
(docs/accumulation.md). Equal when every microbatch holds as many tokens; on variable-length
documents (--variable_length) they differ, on a full window: caught at the first step, in its
loss (the bisector's forward phase; test_accumulation_zoo.py; the fuzzer draws documents
where K > 1)."""

import jax
import jax.numpy as jnp

from shard_parity.explicit import dp
from shard_parity.mesh import DATA
from shard_parity.placement import BATCH, REPLICATED
from shard_parity.step import Accumulated, accumulate, as_dtype, bind

from . import planted


def per_microbatch(loss_fn):
    """`loss_fn` with each batch's weights renormalised to average 1 over that batch itself."""

    def loss(model, batch):
        if 'weight' in batch:
            weight = batch['weight']
            batch = {**batch, 'weight': weight * weight.size / jnp.maximum(weight.sum(), 1)}
        return loss_fn(model, batch)

    return Accumulated(loss, getattr(loss_fn, 'steps', 1))


planted(globals(), dp)


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    loss_fn = per_microbatch(loss_fn)  # BUG: each microbatch its own mean
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

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
