"""Shows, side by side, that two training runs agree: `python -m tools.compare A B`.

    python -m tools.compare runs/auto runs/explicit

First compares the settings each run was trained with (its config.json; settings.py): a run
of another length, seed, batch, learning rate or model is a different experiment, so a
difference is named and is an error unless --allow_other_settings; where each run ran (twin,
strategy, mesh as --mesh names it) is printed first and may differ. Then reads each workdir's
metrics.jsonl and prints every logged figure of both runs with their difference, the steps only
one run reached, then each run's throughput. Exits non-zero if the final evaluations differ by
more than --max_accuracy_gap (the MLP's eval_accuracy) or --max_loss_gap (the transformer's
eval_loss), or if any logged figure of either run is NaN or infinite.

Where either run computes or reduces in less than float32 (config.json's dtype, reduce_dtype),
each logged loss is judged against a band instead (docs/numerics.md): two runs that differ only
in rounding stay within numerics.band(compute, reduce, step) x |the figure| of each other, a
band that widens along the trajectory; the band is printed beside each gap, and the first loss
outside it is a disagreement. A run that changed its precision on resume is judged by the band
from its first segment below float32 on. The verdict gives the largest loss gap as a fraction of
the band, and the band's detection limit: a change that moves the loss by less than the band
passes unseen. --max_loss_gap, given, judges the final eval_loss by the fixed limit instead.

Where the runs end at other steps (--allow_other_settings), the final evaluation is judged at the
last step both logged it, and the verdict says which.

Lines are paired by step and by the figures they carry (a step can have a train line and an eval
line), so runs logged at different --log_every or --eval_every still line up: only the steps and
figures both runs logged are compared, and a note says how many metrics lines of each run had no
partner. A train figure is the mean since the run's previous train line; where the two runs'
previous train lines differ (different --log_every), the two means cover different steps, so
their row is marked * and left out of the verdict. Unparsable (torn or garbled) lines are skipped
with a warning; the workdirs are only read. Every error is one line, `error: ...`: exit 2 for a
bad input (a workdir that is not a run or not a finished one, runs of other settings, a flag),
1 where the runs disagree (a final gap beyond the limit, a NaN or infinity).
"""

import math
import os
import pathlib

from absl import flags

from shard_parity import refuse

from . import logs, pairing, settings

MAX_GAP = flags.DEFINE_float(
    'max_accuracy_gap',
    0.003,
    'Largest final eval_accuracy difference that counts as agreeing.',
    lower_bound=0,
)
MAX_LOSS_GAP = flags.DEFINE_float(
    'max_loss_gap',
    0.01,
    'Largest final eval_loss difference that counts as agreeing. Where either run is not '
    'float32 (--dtype, --reduce_dtype) the default is the error model\'s band instead '
    '(docs/numerics.md); given, this limit judges the final eval_loss in its place.',
    lower_bound=0,
)
ALLOW = flags.DEFINE_bool(
    'allow_other_settings',
    False,
    'Compare runs trained with other settings (another --steps, --seed, --batch_size, ...) '
    'instead of refusing them; the differences are still listed.',
)
KEYS = logs.KEYS
F32 = ('float32', 'float32')
DISAGREE = 1  # the exit status of runs that disagree; a refused input (refuse's default) is 2
USAGE = 'usage: python -m tools.compare WORKDIR_A WORKDIR_B'


def same_directory(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist: read() names it
        return pathlib.Path(a).resolve() == pathlib.Path(b).resolve()


class Table:
    """compare's table of the figures both runs logged, and what it found: the largest gap, the
    rows left out (`*`) or across segments (`~`), and the losses against the band."""

    def __init__(self, parts: pairing.Stretches):
        self.parts, self.worst, self.compared, self.windows, self.crossing = parts, 0.0, 0, 0, 0
        self.outside = None  # (step, figure, gap, band) of the first loss outside the band
        self.closest = None  # (gap / band, step, figure): the largest loss gap against its band

    def row(self, step, key, x, y, windows_differ: bool, since) -> str:
        from shard_parity import numerics

        gap, mark, cell = abs(x - y), '', ''
        if logs.kind(key) == 'train' and windows_differ:
            mark, self.windows = ' *', self.windows + 1  # means over other steps: left out
        elif math.isfinite(gap):  # (a NaN or infinity is named after the table)
            self.worst, self.compared = max(self.worst, gap), self.compared + 1
            self.parts.record(step, gap)
            if logs.kind(key) == 'train' and self.parts.crosses(since, step):
                mark, self.crossing = ' ~', self.crossing + 1
        policy = self.parts.policy(step)
        if key.endswith('_loss') and policy != F32:  # the band: relative, widening
            allowed = numerics.band(*policy, step) * max(abs(x), abs(y))
            cell = f' {allowed:>10.3g}'
            if not mark.strip() and allowed > 0 and math.isfinite(gap):
                fraction = gap / allowed
                if self.closest is None or fraction > self.closest[0]:
                    self.closest = (fraction, step, key)
                if not gap <= allowed:
                    cell += ' !'
                    self.outside = self.outside or (step, key, gap, allowed)
        return f'{step:>6} {key:<14} {x:>22.9g} {y:>22.9g} {gap:>13.3g}{cell}{mark}'

    def notes(self) -> list[str]:
        out = []
        if self.windows:
            out.append(
                f'* {self.windows} train figure{"s" * (self.windows > 1)} averaged over different '
                'steps (the runs were logged at different --log_every, or one resumed a '
                'checkpoint that kept no averaging window: train_steps_averaged): left out of '
                'the verdict'
            )
        if self.crossing:
            out.append(
                f'~ {self.crossing} train figure{"s" * (self.crossing > 1)} averaged over steps of '
                'two segments (a run moved inside its window): its steps ran under two plans'
            )
        return out

    def verdict(self) -> str:
        if not self.compared:
            return 'none in common'
        said = 'bitwise identical' if self.worst == 0 else f'largest difference {self.worst:.3g}'
        if self.closest and self.worst:
            fraction, step, key = self.closest
            of = f'{fraction:.2g} of the band' if fraction <= 1 else f'{fraction:.3g} bands'
            said += f'; the losses at most {of} ({key} at step {step})'
        if self.parts.moved:  # a run moved: the verdict of each stretch of segments
            said += f'; by segment: {self.parts.verdicts()}'
        return said


def print_table(names, va, vb, since_a, since_b, parts) -> Table:
    table = Table(parts)
    band = f' {"band":>10}' if parts.policy() != F32 else ''
    print(f'{"step":>6} {"figure":<14} {names[0]:>22} {names[1]:>22} {"|difference|":>13}{band}')
    for step, key in sorted(va.keys() & vb.keys(), key=lambda sk: (sk[0], KEYS.index(sk[1]))):
        if heading := parts.heading(step):
            print(heading)
        differ = since_a.get(step) != since_b.get(step)
        x, y = va[(step, key)], vb[(step, key)]
        print(table.row(step, key, x, y, differ, since_a.get(step)))
    for line in table.notes():
        print(line)
    entries = [{(s, logs.kind(k)) for s, k in v} for v in (va, vb)]
    partnered = {(s, logs.kind(k)) for s, k in va.keys() & vb.keys()}
    lonely = [len(e - partnered) for e in entries]
    if any(lonely):
        print(
            f'note: metrics lines with no partner in the other run (not compared): '
            f'{lonely[0]} of {len(entries[0])} in {names[0]}, '
            f'{lonely[1]} of {len(entries[1])} in {names[1]}'
        )
    if only := logs.one_run_only(names, va, vb):
        print(only)
    return table


def final_figure(names, fa: dict, fb: dict) -> tuple[str, flags.FlagHolder]:
    """The figure the final evaluation is judged on, and its limit: the MLP's runs end on an
    accuracy; the transformer's, which has none, on a loss."""
    if ('eval_accuracy' in fa) != ('eval_accuracy' in fb):
        refuse(
            f'only one of {names[0]} and {names[1]} ends with an eval_accuracy: an MLP '
            'run beside a transformer run? Compare runs of the same model.'
        )
    accuracy = 'eval_accuracy' in fa
    key, limit = ('eval_accuracy', MAX_GAP) if accuracy else ('eval_loss', MAX_LOSS_GAP)
    for name, f in zip(names, (fa, fb)):
        if key not in f:
            refuse(f'the final line of {name}/metrics.jsonl has no {key}')
    return key, limit


def judged(key: str, fa: dict, fb: dict, va: dict, vb: dict):
    """(step, A's value, B's value, label, note): `key` at the last step both runs logged it
    (their final lines included), or the two final lines where they share no such step."""
    ends = [{s: v for (s, k), v in v_.items() if k == key} for v_ in (va, vb)]
    for e, f in zip(ends, (fa, fb)):
        e[int(f['step'])] = f[key]
    common = ends[0].keys() & ends[1].keys()
    if fa['step'] == fb['step']:
        return int(fa['step']), fa[key], fb[key], f'final {key}', ''
    if not common:
        note = f' (step {fa["step"]} vs {fb["step"]}: no step where both logged it)'
        return max(int(fa['step']), int(fb['step'])), fa[key], fb[key], f'final {key}', note
    step = max(common)
    note = f' (the last step both logged it: A ends at step {fa["step"]}, B at {fb["step"]})'
    return step, ends[0][step], ends[1][step], f'{key} at step {step}', note


def main(argv):
    if len(argv) != 3:
        refuse(f'expected two workdirs, got {len(argv) - 1}; {USAGE}')
    names = argv[1], argv[2]
    if same_directory(*names):
        refuse(f'{names[0]} and {names[1]} are the same directory: compare two different runs')
    settings.check_settings(names, ALLOW.value)
    a, b = logs.read(names[0]), logs.read(names[1])
    (va, since_a), (vb, since_b) = logs.figures(a), logs.figures(b)
    parts = pairing.Stretches(*map(settings.settings, names))  # each run's segments
    for line in parts.platform_notes():
        print(line)
    table = print_table(names, va, vb, since_a, since_b, parts)
    if problem := logs.non_finite(names, (a, b)):
        refuse(problem, DISAGREE)
    fa, fb = a[-1], b[-1]
    if unfinished := [n for n, f in zip(names, (fa, fb)) if not f.get('final')]:
        refuse(  # an unfinished run has no final verdict to compare: refused input
            f'{" and ".join(unfinished)} {"have" if len(unfinished) > 1 else "has"} no final '
            'line: did it finish? (rerun its train command to resume it)'
        )
    key, limit = final_figure(names, fa, fb)
    step, x, y, label, note = judged(key, fa, fb, va, vb)
    gap, allowed, limit_text = abs(x - y), limit.value, f'--{limit.name}={limit.value}'
    policy = parts.policy(step)
    banded = policy != F32 and not MAX_LOSS_GAP.present
    if banded and key == 'eval_loss':  # the band's, at the step judged
        from shard_parity import numerics

        allowed = numerics.band(*policy, step) * max(abs(x), abs(y))
        limit_text = f'the {"/".join(policy)} band {allowed:.3g} (docs/numerics.md)'
    shared = ' where both logged it' if fa['step'] != fb['step'] else ''
    print(f'\n{label}{note} {x:.4f} vs {y:.4f} (gap {gap:.4f}); every logged figure: '
          f'{table.verdict()}{shared}')  # fmt: skip
    if rows := logs.throughput_table(names, (fa, fb)):
        print('\n' + '\n'.join(rows))
    if banded:
        print(band_limit(parts, step))
    if table.outside and banded:
        at, figure, far, band = table.outside
        refuse(f'{figure} at step {at} differs by {far:.3g}, outside the band {band:.3g} '
               f'({far / band:.3g} bands): more than {"/".join(policy)} round-off',
               DISAGREE)  # fmt: skip
    if gap > allowed:
        refuse(f'{label} values differ by {gap:.4f} > {limit_text}', DISAGREE)


def band_limit(parts: pairing.Stretches, step: int) -> str:
    """What the band is, and what it cannot see (docs/numerics.md, 'What the band detects')."""
    from shard_parity import numerics

    policy = parts.policy()
    relative = numerics.band(*parts.policy(step), step)
    return (
        f'band: two runs that differ only in rounding ({"/".join(policy)}, the coarser policy) '
        f'stay within it; it cannot tell round-off from a change that moves a loss by less than '
        f'the band ({relative:.2%} of the loss at step {step}): a learning rate changed by 5% '
        'or less passes 300 steps of the tests\' transformer unseen (docs/numerics.md)'
    )
