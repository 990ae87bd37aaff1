"""explicit/tp.py with a pmean over 'model' where tensor parallelism's psum belongs (the bug zoo)."""

import jax

from shard_parity.mesh import DATA, MODEL
from shard_parity.placement import BATCH, REPLICATED, state_specs
from shard_parity.step import bind, make_train_step

STRATEGY = 'tp'  # --strategy=tp: layers split over 'model', the batch over 'data'


def sum_partials(y):  # y: f32[B/d, T, C], this device's share of a row-parallel matmul
    return jax.lax.pmean(y, MODEL)  # BUG: pmean, so each output is 1/m of the sum


def loss_and_grads(graphdef, loss_fn, mesh):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn, sum_partials=sum_partials), has_aux=True)

    def fn(params, batch):  # params: this device's slice of each layer; batch: x[B/d, ...]
        specs = state_specs(params, STRATEGY, mesh)

        def local(params, batch):
            # As in dp: varying over 'data', so that the pmean below is a mean, not n x a sum.
            params = jax.lax.pcast(params, DATA, to='varying')
            (_, metrics), grads = grad_fn(params, batch)
            return jax.lax.pmean((metrics, grads), DATA)  # the gradient all-reduce over 'data'

        return jax.shard_map(
            local, mesh=mesh, in_specs=(specs, BATCH), out_specs=(REPLICATED, specs)
        )(params, batch)

    return jax.jit(fn)


def train_step(graphdef, loss_fn, tx, mesh):
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh), tx, mesh, STRATEGY)


def eval_step(graphdef, eval_fn, mesh):
    fn = bind(graphdef, eval_fn, sum_partials=sum_partials)

    def evaluate(params, batch):  # the activations' psums; per-example outputs stay split
        specs = state_specs(params, STRATEGY, mesh)
        return jax.shard_map(fn, mesh=mesh, in_specs=(specs, BATCH), out_specs=BATCH)(params, batch)

    return jax.jit(evaluate)
