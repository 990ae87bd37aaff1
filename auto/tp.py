"""Tensor parallelism the compiler writes: we place the weights, XLA finds the all-reduces.

The placement is Megatron's (shard_parity/placement.py): column-parallel kernels
@ P(None, 'model'), row-parallel ones @ P('model', None), the batch @ P('data'). From that alone
XLA's sharding propagation splits the activations between the two: `x @ W_col` comes out split
on its features, so the heads are split too, and `h @ W_row` contracts a split dimension, which
leaves partial sums that it all-reduces over 'model': the psum explicit/tp.py writes. No
activation needs an annotation here (python -m parity_tests.collectives --strategy=tp shows
the all-reduces match). The step is auto/fsdp.py's, with this placement.
"""

import functools

from auto import fsdp

STRATEGY = 'tp'  # --strategy=tp
BATCH, REPLICATED = fsdp.BATCH, fsdp.REPLICATED
place_batch = fsdp.place_batch
state_shardings = functools.partial(fsdp.state_shardings, strategy=STRATEGY)
place_state = functools.partial(fsdp.place_state, strategy=STRATEGY)
loss_and_grads = functools.partial(fsdp.loss_and_grads, strategy=STRATEGY)
train_step = functools.partial(fsdp.train_step, strategy=STRATEGY)
eval_step = functools.partial(fsdp.eval_step, strategy=STRATEGY)
