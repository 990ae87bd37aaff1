"""explicit/dp.py with every update 1% too large, as a learning rate 1% high (the bug zoo): the
forward, the loss and the gradients right, each parameter's step x 1.01. An update-phase bug
of small effect: the parameters move 1% of one step away from the right ones, which AdamW's
state does not see. It needs a learning rate above 0 at the step compared (the transformer's
warm-up starts at 0: the tests run it with --warmup_steps=0, or from a trained state)."""

import jax
import optax

from shard_parity.explicit import dp
from shard_parity.explicit.dp import loss_and_grads
from shard_parity.step import make_train_step

from . import planted

FACTOR = 1.01  # the planted effect (benchmarks/detection.py varies it)


def larger(tx, by):
    """`tx` whose updates are `by` times its own (its state as `tx` keeps it)."""

    def update(updates, state, params=None):
        updates, state = tx.update(updates, state, params)
        return jax.tree.map(lambda u: u * by, updates), state

    return optax.GradientTransformation(tx.init, update)


planted(globals(), dp)


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: the same on every device (replicated)
    tx = larger(tx, FACTOR)  # BUG: each step 1% too large
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)
