"""explicit/dp.py with AdamW's weight decay on every leaf, where the project decays the weight
matrices and embeddings only (the bug zoo): the LayerNorm scales and the biases decay too, as a
mask that forgot a stacked norm scale f32[L, C] is a vector of each layer (step.py's
matrices_only). The decay a matrix gets, rate x weight_decay x p, is measured from the
optimizer itself (its update at p against its update at 0), so the entry follows any schedule;
it is 0 where the rate is 0 (the transformer's warm-up's first step: the tests run it with
--warmup_steps=0, or from a trained state)."""

import jax
import jax.numpy as jnp
import optax

from shard_parity.explicit import dp
from shard_parity.explicit.dp import loss_and_grads
from shard_parity.placement import layer_dims
from shard_parity.step import make_train_step

from . import planted


def decayed_everywhere(tx):
    """`tx` whose updates also decay the leaves of fewer than 2 dimensions per layer (biases,
    norm scales) by the rate x weight decay its matrices get."""

    def update(updates, state, params=None):
        out, new_state = tx.update(updates, state, params)
        at_zero, _ = tx.update(updates, state, jax.tree.map(jnp.zeros_like, params))
        ranks = jax.tree_util.tree_map_with_path(lambda k, p: p.ndim - layer_dims(k), params)
        leaves = list(zip(*map(jax.tree.leaves, (ranks, params, out, at_zero))))
        _, p, u, z = max(leaves, key=lambda t: t[0])  # a matrix: decayed by the right mask
        rate = jnp.sum((z - u) * p) / jnp.maximum(jnp.sum(p * p), 1e-30)  # rate x weight_decay
        decay = lambda r, u, p: u - rate * p if r < 2 else u  # noqa: E731 (the others: decayed)
        return jax.tree.map(decay, ranks, out, params), new_state

    return optax.GradientTransformation(tx.init, update)


planted(globals(), dp)


def train_step(graphdef, loss_fn, tx, mesh, plan):
    # the gradients, then the shared update: the same on every device (replicated)
    tx = decayed_everywhere(tx)  # BUG: weight decay on the norms and biases too
    return make_train_step(loss_and_grads(graphdef, loss_fn, mesh, plan), tx, mesh, plan)
