"""The collectives inspector: which line put each collective of a compiled JAX program there,
forward or backward, over which mesh axes, written or partitioner-inserted, how often per step,
what it would cost on named hardware, and what is surprising about it.

    from shard_parity import inspector
    report = inspector.inspect(jax.jit(f), *args)   # arrays or ShapeDtypeStructs
    print(report.text()); report.json(); report.html('report.html')

Generic, for any jitted program (these import nothing of the twins, the models or the train
CLI; test_inspector_parsing.py checks): program.py (`inspect`, `Report`), hlo_module.py (the
compiled program's HLO text, parsed), hlo.py (its collectives), mechanisms.py (what a compiler
made of a written collective, found in the HLO by dataflow.py's walks; slices.py, what each
device keeps of an all-reduce's result), attribute.py (line, phase, axes, origin, trips),
asked.py (the dtypes the partitioned program asked for, beside
those the compiled one carries), cost.py (predicted times), target.py (the devices of hardware
that is not here: `inspect(..., target=...)`), target_figures.py (its compiler's memory and cost
figures), hosts.py (a mesh laid over hosts, each collective priced by the link it spans),
surprises.py, reconcile.py (a program held against expected records, row by row), and the
reports: render.py, html.py, trace.py.
What knows this project: twins.py (each twin's compiled step for one strategy, side by side;
compare.py, what one moves that another does not), expect.py, records.py and pieces.py (the
collectives each strategy should hold), policy.py (each collective's dtypes held against the
plan's precision policy), and cli.py's twin mode
(the train CLI's flags and checks; its --program=MODULE:FUNCTION mode is the generic one).

The command line is `python -m inspector` (installed: `python -m shard_parity.inspector`); see
docs/inspector.md.
"""

from .program import Report, inspect

__all__ = ['Report', 'inspect']
