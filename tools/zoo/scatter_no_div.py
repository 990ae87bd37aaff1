"""explicit/fsdp.py with the reduce-scatter's division by n left out (the bug zoo): each device's
shard of a gradient is the sum of the n devices' gradients, not their mean."""

import jax

from shard_parity.explicit import fsdp
from shard_parity.mesh import FSDP

from . import planted

planted(globals(), fsdp)


def scatter(grad, spec):  # the local gradient of a whole weight -> the mean for my shard
    if FSDP not in spec:
        return jax.lax.pmean(grad, FSDP)  # all-reduce
    return (
        jax.lax.psum_scatter(grad, FSDP, scatter_dimension=spec.index(FSDP), tiled=True)
        # BUG: no / jax.lax.axis_size(FSDP): the sum of the n gradients, not their mean
    )
