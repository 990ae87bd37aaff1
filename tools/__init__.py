"""The user's tools around the twins, each its own command (installed: `python -m
shard_parity.tools.<name>`, from any directory); a command with helpers is a package whose
cli.py is the command and __main__.py runs it:

    python -m tools.compare A B          two runs' settings, then their logs side by side
                                         (compare/: cli.py, logs.py, settings.py, pairing.py)
    python -m tools.launch -- CMD        CMD as several local processes (jax.distributed)
                                         (launch/: cli.py, net.py)
    python -m tools.bisect --twins=A,B   where two twins, strategy modules or runs first part
                                         (bisect/: cli.py, report.py, divergence.py,
                                         stepping.py, intercept.py, sides.py, runs.py, leaves.py)
    python -m tools.fuzz                 random whole steps against one device
                                         (fuzz/: cli.py, draws, driver, judge, table, target,
                                         worker, checkpoint; corpus/ the failures found)
    python -m tools.margins              each parity test's margin on this machine (a checkout)

zoo/ holds the bug zoo, planted mistakes the bisector finds; upstream/ minimal reproducers of
JAX behaviours the fuzzer met. The collectives inspector is a package of its own: `python -m
inspector`.
"""
