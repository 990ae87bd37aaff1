"""Data parallelism with input dropout, drawn right: each example's mask comes from a key folded
with its row in the global batch, so 1 device and n devices drop the same pixels. The reference
for dropout_key.py (the bug zoo); compare both with --twins=tools.zoo.dropout,...
"""

import jax

from shard_parity.mesh import DATA
from shard_parity.placement import BATCH, REPLICATED
from shard_parity.step import bind, make_train_step

STRATEGY = 'dp'
KEY = jax.random.key(0)


def rows(b):  # the global rows of this device's b examples
    return jax.lax.axis_index(DATA) * b + jax.numpy.arange(b)


def dropout(batch, keep=0.9):
    x = batch['image']  # f32[B/n, 784]
    draw = lambda r: jax.random.bernoulli(jax.random.fold_in(KEY, r), keep, x.shape[1:])  # noqa: E731
    return dict(batch, image=x * jax.vmap(draw)(rows(x.shape[0])) / keep)


def loss_and_grads(graphdef, loss_fn, mesh):
    grad_fn = jax.value_and_grad(bind(graphdef, loss_fn), has_aux=True)

    def fn(params, batch):
        params = jax.lax.pcast(params, DATA, to='varying')
        (_, metrics), grads = grad_fn(params, dropout(batch))
        return jax.lax.pmean((metrics, grads), DATA)

    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(REPLICATED, BATCH), out_specs=REPLICATED))


def train_step(graphdef, loss_fn, tx, mesh):
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh), tx, mesh, STRATEGY)


def eval_step(graphdef, eval_fn, mesh):
    fn = bind(graphdef, eval_fn)

    def evaluate(params, batch):
        local = lambda params, batch: fn(params, dropout(batch))  # noqa: E731
        return jax.shard_map(local, mesh=mesh, in_specs=(REPLICATED, BATCH), out_specs=BATCH)(
            params, batch
        )

    return jax.jit(evaluate)
