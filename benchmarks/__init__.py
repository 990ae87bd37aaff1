"""Benchmarks: measured figures, never assertions. Run `python -m benchmarks.run`."""
