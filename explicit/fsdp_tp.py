"""FSDP and tensor parallelism together, written by hand, on a DATA x MODEL mesh.

Each weight is first split for tensor parallelism over 'model' (explicit/tp.py), and that slice
again over 'data' (shard_parity/placement.py): a column-parallel kernel f32[in, out] lives as
f32[in/d, out/m]. Each step all-gathers it over 'data' into this device's tensor-parallel slice
f32[in, out/m], runs the tensor-parallel model (its psums over 'model'), and reduce-scatters
the gradient over 'data': explicit/fsdp.py's functions, with tp's placement and model binding.
"""

import functools

from explicit import fsdp, tp

STRATEGY = 'fsdp_tp'  # --strategy=fsdp_tp
BATCH, REPLICATED = fsdp.BATCH, fsdp.REPLICATED
place_batch = fsdp.place_batch
state_shardings = functools.partial(fsdp.state_shardings, strategy=STRATEGY)
place_state = functools.partial(fsdp.place_state, strategy=STRATEGY)
loss_and_grads = functools.partial(fsdp.loss_and_grads, strategy=STRATEGY, bind=tp.bind)
train_step = functools.partial(fsdp.train_step, strategy=STRATEGY, bind=tp.bind)
eval_step = functools.partial(fsdp.eval_step, strategy=STRATEGY, bind=tp.bind)
