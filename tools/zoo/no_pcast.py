"""explicit/dp.py without the pcast before grad: the gradient comes out summed (the bug zoo)."""

import jax

from shard_parity.mesh import DATA
from shard_parity.placement import BATCH, REPLICATED
from shard_parity.step import bind, make_train_step

STRATEGY = 'dp'


def loss_and_grads(graphdef, loss_fn, mesh):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def fn(params, batch):
        # BUG: no jax.lax.pcast(params, DATA, to='varying') here
        (_, metrics), grads = grad_fn(params, batch)
        return jax.lax.pmean((metrics, grads), DATA)

    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(REPLICATED, BATCH), out_specs=REPLICATED))


def train_step(graphdef, loss_fn, tx, mesh):
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh), tx, mesh, STRATEGY)


def eval_step(graphdef, eval_fn, mesh):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):
        return jax.shard_map(fn, mesh=mesh, in_specs=(REPLICATED, BATCH), out_specs=BATCH)(
            params, batch
        )

    return jax.jit(evaluate)
