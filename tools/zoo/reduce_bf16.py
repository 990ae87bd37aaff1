"""explicit/dp.py with the gradients all-reduced in bf16 whatever --reduce_dtype says (the
bug zoo): a float32 policy's gradients averaged in bfloat16, each device's rounded to 8 bits of
mantissa before the sum. The losses and gradients stay within a bf16 round-off of the right
ones; the inspector's dtype audit names the all-reduce (a `dtype-asked` surprise)."""

import jax

from shard_parity.explicit import dp
from shard_parity.mesh import DATA
from shard_parity.placement import BATCH, REPLICATED
from shard_parity.step import accumulate, as_dtype, bind

from . import planted

planted(globals(), dp)


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def local(params, batch):  # params: the full arrays; batch: x[B/n, ...], this device's rows
        # Mark the params as varying per device first. Left invariant, `grad` would transpose their
        # implicit broadcast into a psum, and the pmean below would return the sum, n times too big.
        params = jax.lax.pcast(params, DATA, to='varying')
        # the loss and gradient of the local rows, summed over K microbatches of them (local)
        (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
        grads = as_dtype(grads, 'bfloat16')  # BUG: bf16, not plan.precision.reduce
        return jax.lax.pmean((metrics, grads), DATA)  # the all-reduce: average over the 'data' axis

    # the step: `local` on each device's shard (the specs are fixed: nothing to build first)
    fn = jax.shard_map(local, mesh=mesh, in_specs=(REPLICATED, BATCH), out_specs=REPLICATED)
    return jax.jit(fn)
