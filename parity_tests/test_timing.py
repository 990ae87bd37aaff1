"""benchmarks.timing.interleaved: the order in which it times its candidates."""

import itertools

from benchmarks.timing import interleaved


def calls_per_round(names: str, rounds: int) -> list[tuple]:
    calls = []
    interleaved({n: (lambda n=n: calls.append(n)) for n in names}, rounds=rounds, warmup=0)
    return [tuple(calls[i : i + len(names)]) for i in range(0, len(calls), len(names))]


def test_three_candidates_run_in_every_order():
    """A plain rotation (a b c, b c a, c a b) puts b after a in every round: whatever a leaves
    behind would always land on b. Six rounds take all six orders."""
    rounds = calls_per_round('abc', 6)
    assert sorted(rounds) == sorted(itertools.permutations('abc'))
    calls = [n for r in rounds for n in r]
    assert {(x, y) for x, y in zip(calls, calls[1:]) if x != y} == {
        (x, y) for x in 'abc' for y in 'abc' if x != y
    }


def test_two_candidates_take_turns_going_first():
    rounds = calls_per_round('ab', 4)
    assert [r[0] for r in rounds].count('a') == 2
    assert set(rounds) == {('a', 'b'), ('b', 'a')}


def test_every_candidate_runs_once_per_round_and_gets_a_median():
    rounds = calls_per_round('abcd', 7)
    assert all(sorted(r) == list('abcd') for r in rounds)
    out = interleaved({n: (lambda: None) for n in 'abcd'}, rounds=3)
    assert set(out) == set('abcd') | {'_spread'}
