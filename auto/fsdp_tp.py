"""FSDP and tensor parallelism together, by placement only, on a DATA x MODEL mesh.

Each weight carries both splits (shard_parity/placement.py): tensor parallelism's over 'model'
and FSDP's over 'data' on a dimension tp leaves free, e.g. a column-parallel kernel
@ P('data', 'model'). XLA all-gathers over 'data' before use, all-reduces activations over
'model', and reduce-scatters gradients over 'data'. Compare explicit/fsdp_tp.py.
"""

import functools

from auto import fsdp

STRATEGY = 'fsdp_tp'  # --strategy=fsdp_tp
BATCH, REPLICATED = fsdp.BATCH, fsdp.REPLICATED
place_batch = fsdp.place_batch
state_shardings = functools.partial(fsdp.state_shardings, strategy=STRATEGY)
place_state = functools.partial(fsdp.place_state, strategy=STRATEGY)
loss_and_grads = functools.partial(fsdp.loss_and_grads, strategy=STRATEGY)
train_step = functools.partial(fsdp.train_step, strategy=STRATEGY)
eval_step = functools.partial(fsdp.eval_step, strategy=STRATEGY)
