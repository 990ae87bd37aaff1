"""explicit/dp.py with input dropout, drawn right: each example's mask comes from a key folded
with its row in the global batch, so 1 device and n devices drop the same pixels. No bug: the
reference for dropout_key.py (the bug zoo); compare both with
--twins=tools.zoo.dropout,tools.zoo.dropout_key. `bind` is dp.py's with dropout(batch) in
front, so the model sees the dropped pixels wherever dp.py binds it: training and evaluation.
"""

import jax

from shard_parity import step
from shard_parity.explicit import dp
from shard_parity.mesh import DATA

from . import planted

planted(globals(), dp)
KEY = jax.random.key(0)


def rows(b):  # the global rows of this device's b examples
    return jax.lax.axis_index(DATA) * b + jax.numpy.arange(b)


def dropout(batch, keep=0.9):
    x = batch['image']  # f32[B/n, 784]
    draw = lambda r: jax.random.bernoulli(jax.random.fold_in(KEY, r), keep, x.shape[1:])  # noqa: E731
    return dict(batch, image=x * jax.vmap(draw)(rows(x.shape[0])) / keep)


def bind(graphdef, fn, **call):  # shard_parity/step.py's, on the batch after dropout
    bound = step.bind(graphdef, fn, **call)
    return lambda params, batch: bound(params, dropout(batch))
