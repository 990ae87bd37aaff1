"""explicit/composed.py under ZeRO-1 (--shard_optimizer_over_data) with each device's
reduce-scattered gradient shard handed on to its neighbour: device i updates its 1/n of every
param and moment with shard i - 1's gradient, the update applied to the wrong shard (the
bug zoo). Caught at the first step, phase gradients (test_zero1.py)."""

import jax

from shard_parity.explicit import composed, zero1
from shard_parity.explicit.composed import averaged_over
from shard_parity.mesh import DATA, EXPERT
from shard_parity.placement import is_expert
from shard_parity.step import as_dtype

from . import planted

planted(globals(), composed)


def reduce(grads, specs, to, plan):
    """The gradient all-reduces: a mean over `averaged_over`'s axes; an expert's gradient is
    already the sum over its 'expert' group (the all_to_all's transpose), so / n. Under ZeRO-1
    a gradient whose moments `to` splits over 'data' is reduce-scattered there instead."""

    def one(path, g, spec, to):  # the all-reduce over 'data' (and 'seq', the rows of 'expert')
        g, over = as_dtype(g, plan.precision.reduce), averaged_over(plan, spec)
        if to != spec:  # ZeRO-1: the reduce-scatter over 'data' (zero1.py), the rest all-reduced
            g, over = zero1.scatter(g, to, plan), tuple(a for a in over if a != DATA)
            n = plan.size(DATA)  # BUG
            g = jax.lax.ppermute(g, DATA, [(i, (i + 1) % n) for i in range(n)])  # BUG
        g = jax.lax.pmean(g, over)
        return g / plan.size(EXPERT) if is_expert(path) else g

    return jax.tree_util.tree_map_with_path(one, grads, specs, to)
