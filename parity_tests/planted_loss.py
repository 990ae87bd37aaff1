"""explicit/composed.py with the loss metric it reports x (1 + CHANGE), its gradients as they
are, for test_bisect_limits.py: the loss phase's stated detection limit, where the probes jitter
every site (budgets.loss), is what the bisector sees there. The test sets CHANGE."""

from shard_parity.explicit import composed
from tools.zoo import planted

CHANGE = 0.0

planted(globals(), composed)
_original = composed.loss_and_grads


def loss_and_grads(graphdef, loss_fn, mesh, plan):
    inner = _original(graphdef, loss_fn, mesh, plan)

    def planted_loss(params, batch):
        metrics, grads = inner(params, batch)
        return {**metrics, 'loss': metrics['loss'] * (1 + CHANGE)}, grads

    return planted_loss
