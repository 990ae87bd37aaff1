"""explicit/composed.py with the gradients averaged over 'model' and 'stage' too, whose devices
hold different shards of them: one layer's gradient mixed with another's (the bug zoo)."""

import jax

from shard_parity.explicit import composed
from shard_parity.explicit.composed import averaged_over
from shard_parity.mesh import EXPERT, MODEL, STAGE
from shard_parity.placement import is_expert
from shard_parity.step import as_dtype

from . import planted

planted(globals(), composed)


def reduce(grads, specs, plan):
    """The gradient all-reduces: a mean over `averaged_over`'s axes; an expert's gradient is
    already the sum over its 'expert' group (the all_to_all's transpose), so / n."""

    def one(path, g, spec):  # the all-reduce over 'data' (and 'seq', the rows of 'expert')
        wrong = tuple(a for a in (MODEL, STAGE) if a in spec)  # BUG: axes it is split over
        g = jax.lax.pmean(  # BUG: averaged over them too
            as_dtype(g, plan.precision.reduce), averaged_over(plan, spec) + wrong
        )
        return g / plan.size(EXPERT) if is_expert(path) else g

    return jax.tree_util.tree_map_with_path(one, grads, specs)
