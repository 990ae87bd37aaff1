"""Data parallelism the compiler writes: shardings on the inputs, collectives inserted by XLA."""
