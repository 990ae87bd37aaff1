"""explicit/dp.py with the batch's in_spec P() (replicated) where P('data') belongs (the bug zoo)."""

import jax

from shard_parity.mesh import DATA
from shard_parity.placement import BATCH, REPLICATED
from shard_parity.step import bind, make_train_step

STRATEGY = 'dp'
ROWS = REPLICATED  # BUG: the batch's in_spec, BATCH (P('data')) in explicit/dp.py


def loss_and_grads(graphdef, loss_fn, mesh):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def fn(params, batch):
        params = jax.lax.pcast(params, DATA, to='varying')
        (_, metrics), grads = grad_fn(params, batch)
        return jax.lax.pmean((metrics, grads), DATA)

    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(REPLICATED, ROWS), out_specs=REPLICATED))


def train_step(graphdef, loss_fn, tx, mesh):
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh), tx, mesh, STRATEGY)


def eval_step(graphdef, eval_fn, mesh):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):
        return jax.shard_map(fn, mesh=mesh, in_specs=(REPLICATED, ROWS), out_specs=BATCH)(
            params, batch
        )

    return jax.jit(evaluate)
