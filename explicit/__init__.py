"""Data parallelism written by hand: `jax.shard_map` over local shards, one visible `pmean`."""
