"""explicit/fsdp.py with the reduce-scatter's division by n left out (the bug zoo): each device's
shard of a gradient is the sum of the n devices' gradients, not their mean."""

import jax

from shard_parity.explicit import fsdp
from shard_parity.mesh import FSDP
from shard_parity.step import as_dtype

from . import planted

planted(globals(), fsdp)


def scatter(grad, spec, mesh, plan):  # the local gradient of a whole weight -> my shard's mean
    if FSDP not in spec:
        return jax.lax.pmean(as_dtype(grad, plan.precision.reduce), FSDP)  # all-reduce
    return (  # the reduce-scatter, of the gradient cast to --reduce_dtype first
        jax.lax.psum_scatter(as_dtype(grad, plan.precision.reduce), FSDP,
                             scatter_dimension=spec.index(FSDP), tiled=True)
        # BUG: no / jax.lax.axis_size(FSDP): the sum of the n gradients, not their mean
    )  # fmt: skip
