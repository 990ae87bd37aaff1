"""The bug zoo: explicit/dp.py with the gradient all-reduced inside the accumulation loop,
a pmean per microbatch, K all-reduces of the whole gradient per optimizer step where one
belongs. The values are the same within round-off (a mean is linear), so the bisector finds
the runs agreeing; the inspector's `accumulates_in_loop` surprise names it from the compiled
program: an all-reduce inside the loop (test_accumulation_zoo.py); so does the fuzzer's
--target (tools/fuzz/target.py's in_loop) at K = 4, where XLA keeps it in the loop (at K = 2
it adds the two all-reduces into one)."""

import jax

from shard_parity.explicit import dp
from shard_parity.mesh import DATA
from shard_parity.placement import BATCH, REPLICATED
from shard_parity.step import accumulate, as_dtype, bind

from . import planted


def reduced(grad_fn):
    """`grad_fn` whose loss and gradient are averaged over 'data' as soon as they are formed."""
    return lambda params, batch: jax.lax.pmean(grad_fn(params, batch), DATA)


planted(globals(), dp)


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)
    grad_fn = reduced(grad_fn)  # BUG: an all-reduce per microbatch, inside the loop

    def local(params, batch):  # params: the full arrays; batch: x[B/n, ...], this device's rows
        # Mark the params as varying per device first. Left invariant, `grad` would transpose their
        # implicit broadcast into a psum, and the pmean below would return the sum, n times too big.
        params = jax.lax.pcast(params, DATA, to='varying')
        # the loss and gradient of the local rows, summed over K microbatches of them (local)
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
        return (metrics, grads)  # BUG: reduced already, inside the loop

    # the step: `local` on each device's shard (the specs are fixed: nothing to build first)
    fn = jax.shard_map(local, mesh=mesh, in_specs=(REPLICATED, BATCH), out_specs=REPLICATED)
    return jax.jit(fn)
