"""The twin in JAX's Auto mode: we place the arrays (NamedSharding on an AxisType.Auto mesh),
and the compiler inserts the collectives. One whole file per strategy."""

from jax.sharding import AxisType

from . import composed, cp, dp, ep, fsdp, fsdp_tp, pp, pp_1f1b, tp

NAME = 'auto'
AXIS_TYPE = AxisType.Auto  # the mesh the compiler partitions over
RING = False  # under 'seq' XLA partitions the model's own attention, --attention's (no ring of its own)
STRATEGIES = {'dp': dp, 'fsdp': fsdp, 'tp': tp, 'fsdp_tp': fsdp_tp, 'cp': cp, 'pp': pp, 'ep': ep, 'composed': composed}
SCHEDULES = {'1f1b': pp_1f1b, 'interleaved': pp_1f1b}  # --pp_schedule's files (named meshes too); gpipe is pp.py
REDUCES_NARROW = False  # --reduce_dtype=bfloat16 refused: the partitioner reduces where a gradient is formed
