"""The user's tools around the twins, each its own command (installed: `python -m
shard_parity.tools.<name>`, from any directory):

    python -m tools.compare A B          two runs' settings, then their logs side by side
                                         (settings.py: the config.json part)
    python -m tools.launch -- CMD        CMD as several local processes (jax.distributed)
    python -m tools.bisect --twins=A,B   where two twins, strategy modules or runs first part
                                         (divergence.py, sides.py, runs.py, leaves.py: its parts)
    python -m tools.margins              each parity test's margin on this machine (a checkout)

zoo/ holds the bug zoo, planted mistakes the bisector finds. The collectives inspector is a
package of its own: `python -m inspector`.
"""
