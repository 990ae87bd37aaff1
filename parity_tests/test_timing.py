"""benchmarks.timing.interleaved: the order in which it times its candidates, and what it makes
of the times."""

import collections
import itertools
import types

import pytest

from benchmarks import timing
from benchmarks.timing import balanced_orders, interleaved


def timed_rounds(names: str, rounds: int) -> list[tuple]:
    calls = []
    interleaved({n: (lambda n=n: calls.append(n)) for n in names}, rounds=rounds, warmup=0)
    return [tuple(calls[i : i + len(names)]) for i in range(0, len(calls), len(names))]


def followers(rounds: list[tuple]) -> collections.Counter:
    """How often each candidate ran right after each other one, within a round."""
    return collections.Counter(pair for r in rounds for pair in zip(r, r[1:]))


@pytest.mark.parametrize('n', [2, 3, 4, 5, 6])
def test_one_cycle_puts_every_candidate_after_every_other_equally_often(n):
    """A plain rotation (a b c d, b c d a, ...) puts b right after a in every round: whatever a
    leaves behind would always land on b. (Reversing every other round, tried before this, still
    never put c right after a among four.)"""
    names = 'abcdef'[:n]
    cycle = len(balanced_orders(n))
    assert cycle == (n if n % 2 == 0 else 2 * n)
    rounds = timed_rounds(names, cycle)
    assert all(sorted(r) == list(names) for r in rounds)
    pairs = followers(rounds)
    assert set(pairs) == set(itertools.permutations(names, 2))
    assert len(set(pairs.values())) == 1  # every ordered pair equally often
    assert len({r[0] for r in rounds}) == n  # and each candidate leads


def test_three_candidates_run_in_every_order():
    assert sorted(timed_rounds('abc', 6)) == sorted(itertools.permutations('abc'))


def test_a_median_per_candidate_and_its_spread_over_the_timed_rounds_alone(monkeypatch):
    """On a fake clock each call takes its candidate's next duration: the warm-up rounds' (1000 s)
    are left out, the median is that of the timed calls, the spread their least and greatest."""
    now = [0.0]
    monkeypatch.setattr(timing, 'time', types.SimpleNamespace(perf_counter=lambda: now[0]))
    durations = {'a': [1000, 1000, 30, 1, 2], 'b': [1000, 1000, 7, 90, 8, 4]}
    left = {n: iter(d) for n, d in durations.items()}

    def call(name):
        now[0] += next(left[name])

    out = interleaved({'a': lambda: call('a'), 'b': lambda: call('b')}, rounds=3, warmup=2)
    assert out == {'a': 2, 'b': 8, '_spread': {'a': (1, 30), 'b': (7, 90)}}
    assert next(left['b']) == 4  # each candidate ran warmup + rounds times, no more
