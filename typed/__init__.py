"""The twin in JAX's Explicit mode ("sharding in types", AxisType.Explicit): every array's
sharding is part of its type (`jax.typeof(x)`), ambiguous products say their output's sharding
(`out_sharding=`), and data moves only at a `jax.sharding.reshard`. One whole file per strategy.

Mind the names: this folder, typed/, is JAX's Explicit mode; our explicit/ is JAX's Manual mode
(shard_map), and auto/ its Auto mode.
"""

from jax.sharding import AxisType

from . import composed, cp, dp, ep, fsdp, fsdp_tp, pp, pp_1f1b, tp

NAME = 'typed'
AXIS_TYPE = AxisType.Explicit  # the mesh's axes: shardings are types, checked while tracing
RING = True  # under 'seq' this twin runs its own attention (the ring, in shard_map): --attention unused
STRATEGIES = {'dp': dp, 'fsdp': fsdp, 'tp': tp, 'fsdp_tp': fsdp_tp, 'cp': cp, 'pp': pp, 'ep': ep, 'composed': composed}
SCHEDULES = {'1f1b': pp_1f1b, 'interleaved': pp_1f1b}  # --pp_schedule's files (named meshes too); gpipe is pp.py
REDUCES_NARROW = False  # --reduce_dtype=bfloat16 refused: the partitioner reduces where a gradient is formed
