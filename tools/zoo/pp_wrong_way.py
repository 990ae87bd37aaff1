"""explicit/pp.py with its ppermute turned the wrong way: each stage hands its microbatch back to
the previous stage, so the last stage only ever runs on the bubble's zeros (the bug zoo)."""

import jax

from shard_parity.explicit import pp
from shard_parity.mesh import STAGE

from . import planted

planted(globals(), pp)


def pass_on(y, mesh, plan):  # f32[B/dM, T, C]: stage i's output should go to stage i + 1
    return jax.lax.ppermute(y, STAGE, [(i + 1, i) for i in range(plan.size(STAGE) - 1)])  # BUG
