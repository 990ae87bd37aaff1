"""How compare and bisect pair two runs' logs (`python -m tools.compare A B`, `python -m
tools.bisect A B`): a train figure only with one averaged over the same steps, and each stretch of
steps with the segments, the plans, that trained it in each run.

A train line is the mean since the run's previous train line, or, where it says how many steps
it averages (`train_steps_averaged`: the first line after resuming a checkpoint saved before
checkpoints kept the averaging window), over that many. A run that moved meshes keeps each
segment in its config.json (shard_parity/runtime/segments.py); two runs are compared stretch by
stretch, each stretch one segment of A against one of B, and a stretch whose two plans differ
is said to (round-off differences are then expected; the same plan gives the same bits).
"""

import dataclasses

from shard_parity import UsageError
from shard_parity.runtime import segments as S

AVERAGED = 'train_steps_averaged'


def window_starts(records) -> dict[int, int]:
    """{step of a train line: the step its mean starts after}, from the records in step order."""
    since, previous = {}, 0
    for x in records:
        if x.get('final') or not any(k.startswith('train_') for k in x):
            continue
        step, n = int(x['step']), x.get(AVERAGED)
        valid = isinstance(n, int) and not isinstance(n, bool) and 0 < n <= step
        since[step], previous = (step - n if valid else previous), step
    return since


class Stretches:
    """Two runs' segments (None for a run without config.json) and the stretches where one
    segment of A meets one of B."""

    def __init__(self, saved_a: dict | None, saved_b: dict | None):
        self.saved = (saved_a or {}, saved_b or {})
        self.runs = [S.of(s) if s else [] for s in (saved_a, saved_b)]
        self.moved = any(len(r) > 1 for r in self.runs)
        a, b = (r or [{'from_step': 0}] for r in self.runs)
        self.starts = S.pairs(a, b)  # (from_step, segment of A, segment of B)
        self.shown, self.worst = set(), {}
        self.ends = [last_step(s) for s in (saved_a, saved_b)]

    def index(self, step: int) -> int:
        """The stretch that holds `step` (a figure of step s comes from training step s)."""
        return max(i for i, (f, _, _) in enumerate(self.starts) if f < max(step, 1))

    def at(self, step: int) -> tuple[dict, dict]:
        """The segments of A and of B that trained `step` (a config that records no plan: the
        config itself, which segments.plan_of refuses in one line)."""
        _, ia, ib = self.starts[self.index(step)]
        return tuple(r[i] if r else s for r, i, s in zip(self.runs, (ia, ib), self.saved))

    def span(self, i: int) -> str:
        ends = [e for e in self.ends if e]
        end = self.starts[i + 1][0] if i + 1 < len(self.starts) else max(ends, default='')
        return f'steps {self.starts[i][0] + 1}..{end}'

    def plans(self, i: int) -> str:
        """'A explicit pp on stage:2,model:4, B explicit composed on ...: different plans'."""
        _, ia, ib = self.starts[i]
        if not all(self.runs):
            return 'a run whose config.json records no plan: plans unknown'
        sa, sb = self.runs[0][ia], self.runs[1][ib]
        if S.same_plan(sa, sb):
            return f'A and B {S.describe(sa)}: the same plan'
        return f'A {S.describe(sa)}, B {S.describe(sb)}: different plans'

    def heading(self, step: int) -> str | None:
        """The line that opens a stretch in compare's table, the first time one of its rows is
        printed; None otherwise, or when neither run moved."""
        i = self.index(step)
        if not self.moved or i in self.shown:
            return None
        self.shown.add(i)
        return f'-- {self.span(i)}: {self.plans(i)}'

    def crosses(self, since: int | None, step: int) -> bool:
        """Whether a train mean over steps since+1..step spans a segment boundary of either
        run: its steps ran under two plans."""
        return since is not None and any(since < f < step for f, _, _ in self.starts)

    def record(self, step: int, gap: float) -> None:
        i = self.index(step)
        self.worst[i] = max(self.worst.get(i, 0.0), gap)

    def verdicts(self) -> str:
        """Per stretch: 'steps 1..40 (A and B ...: the same plan): bitwise identical'."""
        parts = []
        for i, gap in sorted(self.worst.items()):
            said = 'bitwise identical' if gap == 0 else f'largest difference {gap:.3g}'
            parts.append(f'{self.span(i)} ({self.plans(i)}): {said}')
        return '; '.join(parts)

    def policy(self, step: int | None = None) -> tuple[str, str]:
        """(compute, reduce): the coarsest precision either run trained with up to `step` (None:
        the whole runs), segment by segment (a run without segments: its model_config's). A
        stretch in bf16 leaves its rounding in every step after it: a run back in float32 is
        still judged by the band."""
        from shard_parity import numerics

        found = []
        for run, saved in zip(self.runs, self.saved):
            if not run:  # no plan recorded: the model's own dtypes, if any
                found.append(numerics.saved(saved.get('model_config') or {}))
            found += [precision(s) for s in run if step is None or s['from_step'] < max(step, 1)]
        return numerics.coarsest(found)

    def platform_notes(self) -> list[str]:
        """A line for each run that trained float32 on a TPU at --matmul_precision=default."""

        def float32(s):
            return (s.get('precision') or {}).get('compute', 'float32') == 'float32'

        return [
            f'note: {"AB"[k]} ran float32 on a TPU at --matmul_precision=default, where a float32 '
            'dot is one bfloat16 pass: judged as bfloat16 compute (by the band); '
            '--matmul_precision=highest keeps float32'
            for k, run in enumerate(self.runs)
            if any(bf16_dots(s) and float32(s) for s in run)
        ]

    def lines(self, k: int) -> list[str]:
        """Run k's segments as `history` prints them (none for a run that did not move)."""
        return described(self.runs[k], self.ends[k])


def last_step(saved: dict | None) -> int | str:
    """The run's --steps (config.json), or '' when unknown."""
    steps = (saved or {}).get('train', {}).get('steps')
    return steps if isinstance(steps, int) else ''


def precision(segment: dict) -> tuple[str, str]:
    """(compute, reduce) of a segment as its arithmetic was: float32 on a TPU at
    --matmul_precision=default is bfloat16 compute, a TPU's float32 dot being one bfloat16 pass
    over operands rounded to bfloat16 (`high` and `highest`: three and six passes, float32's)."""
    p = segment.get('precision') or {}
    compute = p.get('compute', 'float32')
    if bf16_dots(segment) and compute == 'float32':
        compute = 'bfloat16'
    return compute, p.get('reduce', 'float32')


def bf16_dots(segment: dict) -> bool:
    """Whether a segment ran on a TPU at --matmul_precision=default (float32 dots in bf16)."""
    return (
        segment.get('platform') == 'tpu'
        and (segment.get('precision') or {}).get('matmul', 'default') == 'default'
    )


def changed(saved: dict | None) -> str | None:
    """What a run changed on resume, from its segments: 'moved meshes', 'changed twin',
    'changed its precision (compute bfloat16 -> float32)', ...; None for a run that did not."""
    found = S.of(saved) if saved else []
    said = []
    for a, b in zip(found, found[1:]):
        try:
            pa, pb = S.plan_of(a), S.plan_of(b)
        except UsageError:
            return 'changed plans'
        moved = (pa.strategy, pa.axes) != (pb.strategy, pb.axes)
        schedule = (pa.schedule, pa.microbatches, pa.chunks, pa.layout)
        for what, differs in (
            ('changed twin', a.get('twin') != b.get('twin')),
            ('moved meshes', moved),  # (a schedule moves with its mesh)
            (f'changed its precision ({policy_change(pa.precision, pb.precision)})',
             pa.precision != pb.precision),
            ('changed its schedule', not moved and schedule != (
                pb.schedule, pb.microbatches, pb.chunks, pb.layout)),
        ):  # fmt: skip
            if differs and what not in said:
                said.append(what)
    return ' and '.join(said) or ('changed plans' if len(found) > 1 else None)


def policy_change(a, b) -> str:
    """'compute bfloat16 -> float32': the fields of two precision policies that differ."""
    x, y = dataclasses.asdict(a), dataclasses.asdict(b)
    return ', '.join(f'{k} {x[k]} -> {y[k]}' for k in x if x[k] != y[k])


def history(name: str, saved: dict | None) -> list[str]:
    """'  A steps 1..40: explicit composed on data:2,fsdp:2,model:2' lines, one per segment, for
    a run that moved (none for one that did not)."""
    found = S.of(saved) if saved else []
    return [f'  {name} {line}' for line in described(found, last_step(saved))]


def described(found: list[dict], last) -> list[str]:
    if len(found) < 2:
        return []
    ends = [s['from_step'] for s in found[1:]] + [last]
    return [f'steps {s["from_step"] + 1}..{end}: {S.describe(s)}' for s, end in zip(found, ends)]
