"""explicit/tp.py with a pmean over 'model' where tensor parallelism's psum belongs (the bug zoo)."""

import jax

from shard_parity.explicit import tp
from shard_parity.mesh import MODEL

from . import planted

planted(globals(), tp)


def sum_partials(y):  # y: f32[B/d, T, C], this device's share of a row-parallel matmul
    return jax.lax.pmean(y, MODEL)  # BUG: pmean, so each output is 1/m of the sum
