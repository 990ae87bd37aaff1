"""The bug zoo: explicit/dp.py whose accumulator is not reset between optimizer steps, each
step's gradient also holding the previous step's last microbatch's. The first step is right
(nothing comes before it); from the second on the gradient is off: caught at step 1, phase
gradients (test_accumulation_zoo.py; the fuzzer's K > 1 draws compare two steps and find it).
The carry lives outside the jitted step, in a Python closure, as a stale accumulator does in a
hand-written loop."""

import jax

from shard_parity.explicit import dp
from shard_parity.mesh import DATA
from shard_parity.placement import BATCH, REPLICATED
from shard_parity.step import (
    SHARE, accumulate, apply_gradients, as_dtype, bind, microbatches, with_grad_norm,
)  # fmt: skip

from . import planted


def carrying(fn):
    """`fn(params, batch, carried) -> (metrics, grads, last)` as `(params, batch) -> (metrics,
    grads)` that keeps `last` for the next call (zero before the first)."""
    held = {}

    def call(params, batch):
        carried = held.get('last', jax.tree.map(jax.numpy.zeros_like, params))
        metrics, grads, held['last'] = fn(params, batch, carried)
        return metrics, grads

    return call


def last_part(grad_fn, params, batch, loss_fn):
    """The gradient of the window's last microbatch, with its 1/K share."""
    k = getattr(loss_fn, 'steps', 1)
    part = {**jax.tree.map(lambda x: x[k - 1], microbatches(batch, k)), SHARE: 1.0 / k}
    return grad_fn(params, part if k > 1 else batch)[1]


planted(globals(), dp)


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def local(params, batch, carried):  # BUG: the last step's last microbatch comes in
        # Mark the params as varying per device first. Left invariant, `grad` would transpose their
        # implicit broadcast into a psum, and the pmean below would return the sum, n times too big.
        params = jax.lax.pcast(params, DATA, to='varying')
        # the loss and gradient of the local rows, summed over K microbatches of them (local)
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        last = last_part(grad_fn, params, batch, loss_fn)  # BUG: kept for the next step
        grads = jax.tree.map(lambda g, c: g + c, grads, carried)  # BUG: not reset
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return jax.lax.pmean((metrics, grads, last), DATA)  # BUG: and the last one's

    # the step: `local` on each device's shard (the specs are fixed: nothing to build first)
    fn = jax.shard_map(local, mesh=mesh, in_specs=(REPLICATED, BATCH, REPLICATED),  # BUG
                       out_specs=REPLICATED)  # fmt: skip
    return carrying(jax.jit(fn))  # BUG: a carry outside the step


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: the same on every device (replicated)
    grads_fn = loss_and_grads(graphdef, loss_fn, mesh, plan)  # BUG: not jitted: it carries
    update = jax.jit(lambda s, g: apply_gradients(s, g, tx), donate_argnums=0)  # BUG

    def step(state, batch):  # BUG: the gradients outside the jitted update
        metrics, grads = grads_fn(state.params, batch)  # BUG
        state = update(state, grads)  # BUG
        return state, with_grad_norm(metrics, state.opt_state)  # BUG

    return step  # BUG
