"""benchmarks.timing.interleaved: the order in which it times its candidates."""

import collections
import itertools

import pytest

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


def test_a_median_per_candidate_and_its_spread():
    out = interleaved({n: (lambda: None) for n in 'abcd'}, rounds=3)
    assert set(out) == set('abcd') | {'_spread'}
    assert all(lo <= out[n] <= hi for n, (lo, hi) in out['_spread'].items())
