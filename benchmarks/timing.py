"""Side-by-side timing: candidates measured interleaved in one process, medians after warm-up.

Each candidate is a callable that does one unit of work and blocks until it is done. Rounds take
the candidates in a rotating order, so drift in the machine (another process, thermal state)
lands on all of them alike, and every other round backwards, so that no candidate always follows
the same one (whatever a candidate leaves behind, in the caches or in freed memory, is met by
each of the others); the median over rounds ignores the odd slow round.
"""

import statistics
import time


def interleaved(candidates: dict, rounds: int = 7, warmup: int = 2) -> dict:
    """{name: median seconds per call}, and the spread as {name: (min, max)} under '_spread'."""
    names = list(candidates)
    times = {name: [] for name in names}
    for r in range(warmup + rounds):
        k = (r // 2) % len(names)
        order = names[k:] + names[:k]
        if r % 2:
            order.reverse()
        for name in order:
            start = time.perf_counter()
            candidates[name]()
            if r >= warmup:
                times[name].append(time.perf_counter() - start)
    out = {name: statistics.median(t) for name, t in times.items()}
    out['_spread'] = {name: (min(t), max(t)) for name, t in times.items()}
    return out
