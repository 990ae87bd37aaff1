"""explicit/dp.py with the transformer's GELU in its tanh approximation, where the model computes
the exact x Phi(x) (nanoGPT's nn.GELU(); shard_parity/model/ops.py's gelu) (the bug zoo): the
classic silent swap of jax.nn.gelu's default, approximate=True. Its effect is small: at most
about 5e-4 of an activation, 1e-4 to 1e-3 of a block's output norm-wise, far above float32's
round-off and far below bf16's. The model's MLP blocks call the gelu their module names; the
entry traces its steps with that name bound to the approximation (and only while its own
functions trace: the other side keeps the exact one)."""

import contextlib
import functools

import jax

from shard_parity.explicit import dp
from shard_parity.mesh import DATA
from shard_parity.model import transformer
from shard_parity.placement import BATCH, REPLICATED
from shard_parity.step import accumulate, as_dtype, bind

from . import planted


@contextlib.contextmanager
def tanh_gelu():
    exact = transformer.gelu
    transformer.gelu = functools.partial(jax.nn.gelu, approximate=True)
    try:
        yield
    finally:
        transformer.gelu = exact


def approximated(fn):
    """`fn(params, batch)` traced with the model's GELU in its tanh approximation."""

    def traced(params, batch):
        with tanh_gelu():
            return fn(params, batch)

    return traced


planted(globals(), dp)


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    grad_fn = jax.value_and_grad(approximated(bind(graphdef, loss_fn)), has_aux=True)  # BUG: tanh

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


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = approximated(bind(graphdef, eval_fn))  # BUG: the tanh approximation

    def evaluate(params, batch):  # per-example outputs of my rows, concatenated: no collective
        return jax.shard_map(fn, mesh=mesh, in_specs=(REPLICATED, BATCH), out_specs=BATCH)(
            params, batch
        )

    return jax.jit(evaluate)
