"""The collectives inspector: which line put each collective of a compiled JAX program there,
forward or backward, over which mesh axes, written or partitioner-inserted, how often per step,
what it would cost on named hardware, and what is surprising about it.

    report = inspector.inspect(jax.jit(f), *args)   # arrays or ShapeDtypeStructs
    print(report.text()); report.json(); report.html('report.html')

The command line is `python -m parity_tests.collectives` (or `python -m inspector`); see
docs/inspector.md.
"""

from .program import Report, inspect

__all__ = ['Report', 'inspect']
