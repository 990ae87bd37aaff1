"""The twin in JAX's Manual mode (jax.shard_map): each device runs on its own shards, and every
collective is a line of its strategy file. One whole file per strategy.

The same names in every file: `local` is the function shard_map runs on each device, `fn` the
jitted step that calls shard_map (building the specs first where they depend on the arrays'
shapes; dp's `fn` is `local` shard_mapped), and `per_device` a shard_map'd callable kept in a
variable. An eval_step's jitted function is `evaluate`; where each device runs the model as it
is, shard_map runs the bound model (`fn = bind(...)`, as in auto/ and typed/).
"""

from jax.sharding import AxisType

from . import composed, cp, dp, ep, fsdp, fsdp_tp, pp, pp_1f1b, tp

NAME = 'explicit'
AXIS_TYPE = AxisType.Auto  # shard_map makes the axes Manual inside its functions
RING = True  # under 'seq' this twin runs its own attention (the ring, shard_parity/model/ring.py): --attention unused
STRATEGIES = {'dp': dp, 'fsdp': fsdp, 'tp': tp, 'fsdp_tp': fsdp_tp, 'cp': cp, 'pp': pp, 'ep': ep, 'composed': composed}
SCHEDULES = {'1f1b': pp_1f1b, 'interleaved': pp_1f1b}  # --pp_schedule's files (named meshes too); gpipe is pp.py
REDUCES_NARROW = True  # --reduce_dtype=bfloat16: each cast a line beside its pmean / psum_scatter
