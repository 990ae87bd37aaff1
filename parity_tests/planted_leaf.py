"""explicit/dp.py with one leaf changed by a known relative amount, for test_bisect_limits.py:
the gradient of LEAF x (1 + CHANGE) (PHASE 'gradients'), or the step AdamW makes of it x (1 +
CHANGE) (PHASE 'update'). The test sets the three names, and checks that the bisector's stated
detection limit for that leaf is what it sees: twice the limit caught, half of it "agree"."""

import jax
import optax

from shard_parity.explicit import dp
from shard_parity.step import make_train_step
from tools.bisect.leaves import named_leaves
from tools.zoo import planted

LEAF = 'blocks.ffn.up.kernel'
CHANGE = 0.0
PHASE = 'gradients'

planted(globals(), dp)
_original = dp.loss_and_grads


def _scaled(tree):
    paths = [p for p, _ in named_leaves(tree)]
    leaves, treedef = jax.tree.flatten(tree)
    return jax.tree.unflatten(
        treedef, [x * (1 + CHANGE) if p == LEAF else x for p, x in zip(paths, leaves)]
    )


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    inner = _original(graphdef, loss_fn, mesh, plan)
    if PHASE != 'gradients':
        return inner

    def planted_grads(params, batch):
        metrics, grads = inner(params, batch)
        return metrics, _scaled(grads)

    return planted_grads


def _larger(tx):
    def update(updates, state, params=None):
        updates, state = tx.update(updates, state, params)
        return _scaled(updates), state

    return optax.GradientTransformation(tx.init, update)


def train_step(graphdef, loss_fn, tx, mesh, plan):
    tx = _larger(tx) if PHASE == 'update' else tx
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)
