"""explicit/composed.py with the gradients averaged over 'model' and 'stage' too, whose devices
hold different shards of them: one layer's gradient mixed with another's (the bug zoo)."""

import jax

from shard_parity.explicit import composed, zero1
from shard_parity.explicit.composed import averaged_over
from shard_parity.mesh import DATA, EXPERT, MODEL, STAGE
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
        over += tuple(a for a in (MODEL, STAGE) if a in spec)  # BUG: averaged over its own split
        if to != spec:  # ZeRO-1: the reduce-scatter over 'data' (zero1.py), the rest all-reduced
            g, over = zero1.scatter(g, to, plan), tuple(a for a in over if a != DATA)
        g = jax.lax.pmean(g, over)
        return g / plan.size(EXPERT) if is_expert(path) else g

    return jax.tree_util.tree_map_with_path(one, grads, specs, to)
