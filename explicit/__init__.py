"""The twin in JAX's Manual mode (jax.shard_map): each device runs on its own shards, and every
collective is a line of its strategy file. One whole file per strategy."""

from explicit import cp, dp, fsdp, fsdp_tp, tp

NAME = 'explicit'
STRATEGIES = {'dp': dp, 'fsdp': fsdp, 'tp': tp, 'fsdp_tp': fsdp_tp, 'cp': cp}
