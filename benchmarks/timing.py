"""Side-by-side timing: candidates measured interleaved in one process, medians after warm-up.

Each candidate is a callable that does one unit of work and blocks until it is done. Every round
runs each candidate once, so drift in the machine (another process, thermal state) lands on all
of them alike, and the rounds take their orders from a Williams design: over each cycle of
orders every candidate runs first equally often and right after every other candidate equally
often. Whatever a candidate leaves behind (in the caches, in freed memory, in threads still
winding down) then lands on all of the others alike, not always on the same one, as it did
under a plain rotation. The median over rounds ignores the odd slow round.
"""

import statistics
import time


def balanced_orders(n: int) -> list[list[int]]:
    """Williams' Latin square for n candidates: n orders for an even n, 2n for an odd one (each
    order and its reverse), in which every ordered pair (a right before b) occurs equally often."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        if len(first) % 2:
            first, low = first + [low], low + 1
        else:
            first, high = first + [high], high - 1
    orders = [[(i + shift) % n for i in first] for shift in range(n)]
    return orders + [order[::-1] for order in orders] if n % 2 else orders


def interleaved(candidates: dict, rounds: int = 7, warmup: int = 2) -> dict:
    """{name: median seconds per call}, and the spread as {name: (min, max)} under '_spread'.
    The timed rounds start the cycle of orders, so `rounds` a multiple of the cycle (n
    candidates: n if n is even, 2n if odd) balances it exactly."""
    names = list(candidates)
    orders = balanced_orders(len(names))
    times = {name: [] for name in names}
    for r in range(warmup + rounds):
        for i in orders[(r - warmup) % len(orders)]:
            start = time.perf_counter()
            candidates[names[i]]()
            if r >= warmup:
                times[names[i]].append(time.perf_counter() - start)
    out = {name: statistics.median(t) for name, t in times.items()}
    out['_spread'] = {name: (min(t), max(t)) for name, t in times.items()}
    return out
