"""Tensor parallelism (Megatron) written by hand, with data parallelism over the other axis.

On a DATA x MODEL mesh each 'model' group of devices shares one slice of the batch and splits
every layer between them (shard_parity/placement.py): column-parallel kernels arrive as
f32[in, out/m], row-parallel ones as f32[in/m, out]. Each device runs H/m whole attention heads
and 4C/m feed-forward features, and a row-parallel layer leaves it a partial sum of the output:
`sum_partials` below, a psum over 'model' passed into the model call, is the only collective
tensor parallelism adds to the forward pass. Its backward twin, the all-reduce of the
activations' gradient before each column-parallel layer, comes from `grad` itself: those inputs
are the same on every device of the group (invariant over 'model'), and the transpose of using
them in per-device work is a psum. Compare auto/tp.py, which only places the weights.
"""

import jax

from shard_parity.mesh import DATA, MODEL
from shard_parity.placement import BATCH, REPLICATED, state_specs
from shard_parity.step import accumulate, as_dtype, bind, make_train_step

STRATEGY = 'tp'  # --strategy=tp: layers split over 'model', the batch over 'data'


def sum_partials(y):  # y: f32[B/d, T, C], this device's share of a row-parallel matmul
    return jax.lax.psum(y, MODEL)  # the all-reduce of activations (Megatron's "g")


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, sum_partials=sum_partials), has_aux=True)

    def fn(params, batch):  # params: this device's slice of each layer; batch: x[B/d, ...]
        specs = state_specs(params, plan, mesh)

        def local(params, batch):
            # As in dp: varying over 'data', so that the pmean below is a mean, not n x a sum.
            params = jax.lax.pcast(params, DATA, to='varying')
            (_, metrics), grads = accumulate(grad_fn, params, batch, loss_fn)
            grads = as_dtype(grads, plan.precision.reduce)  # what the all-reduce carries
            return jax.lax.pmean((metrics, grads), DATA)  # the gradient all-reduce over 'data'

        return jax.shard_map(
            local, mesh=mesh, in_specs=(specs, BATCH), out_specs=(REPLICATED, specs)
        )(params, batch)

    return jax.jit(fn)


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: each device updates its own slices
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)


def eval_step(graphdef, eval_fn, mesh, plan):
    fn = bind(graphdef, eval_fn, sum_partials=sum_partials)

    def evaluate(params, batch):  # the activations' psums; per-example outputs stay split
        specs = state_specs(params, plan, mesh)
        return jax.shard_map(fn, mesh=mesh, in_specs=(specs, BATCH), out_specs=BATCH)(params, batch)

    return jax.jit(evaluate)
