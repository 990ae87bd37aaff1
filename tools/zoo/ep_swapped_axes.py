"""explicit/ep.py with the all_to_alls over 'data' where 'expert' belongs (the bug zoo).

The mesh's two axes swapped in the exchange: on a square mesh (2x2) every shape still fits, but
each expert's slots go to the device of another 'data' row that holds the same experts as the
sender, so they run through the wrong experts. The routing is local and stays right.
"""

import jax

from shard_parity.explicit import ep
from shard_parity.mesh import DATA

from . import planted

planted(globals(), ep)


def exchange(xe, experts):  # xe: [E, b, cap, C], my b rows' slots for every expert
    # the first all-to-all: expert e's slots to the device holding it; in come my E/n experts'
    # slots from all n devices of my 'expert' group, side by side: [E/n, n b, cap, C]
    x = jax.lax.all_to_all(xe, DATA, split_axis=0, concat_axis=1, tiled=True)  # BUG: 'data'
    y = experts(x)  # my E/n experts on every slot they were sent
    # the second all-to-all: each output back to the device its token came from: [E, b, cap, C]
    return jax.lax.all_to_all(y, DATA, split_axis=1, concat_axis=0, tiled=True)  # BUG: 'data'
