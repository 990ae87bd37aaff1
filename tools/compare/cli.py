"""Shows, side by side, that two training runs agree: `python -m tools.compare A B`.

    python -m tools.compare runs/auto runs/explicit

First compares the settings each run was trained with (its config.json; tools/compare/settings.py): a
run of another length, seed, batch, learning rate or model is a different experiment, so a
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
outside it is a disagreement. --max_loss_gap, given, judges the final eval_loss by the fixed
limit instead.

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

import json
import math
import os
import pathlib
import sys

from absl import app, flags

from shard_parity import quiet_on_broken_pipe, refuse
from shard_parity.runtime import declare_key_flags, parse_flags

from . import pairing, settings

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
KEYS = ('train_loss', 'eval_loss', 'eval_accuracy')
DISAGREE = 1  # the exit status of runs that disagree; a refused input (refuse's default) is 2
USAGE = 'usage: python -m tools.compare WORKDIR_A WORKDIR_B'


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def usable(record) -> bool:
    """A metrics line as the train loop writes it: an object with an integer step, and numbers
    for the figures compare reads."""
    return (
        isinstance(record, dict)
        and is_number(record.get('step'))
        and math.isfinite(record['step'])
        and record['step'] == int(record['step'])
        and all(is_number(record[k]) for k in KEYS if k in record)
    )


def read(workdir: str) -> list[dict]:
    path = pathlib.Path(workdir) / 'metrics.jsonl'
    if not path.exists():
        refuse(f'{path} does not exist: train first with --workdir={workdir}')
    try:
        text = path.read_bytes().decode('utf-8', errors='replace')
    except OSError as e:
        refuse(f'cannot read {path}: {e.strerror}')
    lines, skipped = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if usable(record):
            lines.append(record)
        else:
            skipped += 1
    if skipped:
        print(
            f'warning: skipped {skipped} unparsable line{"s" * (skipped > 1)} of {path} '
            '(torn or garbled)',
            file=sys.stderr,
        )
    if not lines:  # not a run compare can read: refused input
        if skipped:
            refuse(f'{path} has no readable line: all {skipped} are unparsable')
        refuse(f'{path} is empty: the run logged nothing (did it fail at the start?)')
    return lines


def figures(lines: list[dict]) -> tuple[dict, dict]:
    """{(step, figure): value} of the lines before the final one, and {step: the step a train
    line's mean starts after} (tools/compare/pairing.py: the previous train line, or the steps it says
    it averages, train_steps_averaged)."""
    values = {}
    for x in lines:
        if x.get('final'):
            continue
        step = int(x['step'])
        for key in KEYS:
            if key in x:
                values[(step, key)] = x[key]
    return values, pairing.window_starts(lines)


def kind(key: str) -> str:
    return key.split('_')[0]  # 'train' or 'eval': the line that carries the figure


def same_directory(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist: read() names it
        return pathlib.Path(a).resolve() == pathlib.Path(b).resolve()


def non_finite(names, runs) -> str | None:
    """A one-line description of the first NaN or infinity among the compared figures."""
    found = []
    for name, lines in zip(names, runs):
        for x in lines:
            for key in KEYS:
                if key in x and not math.isfinite(x[key]):
                    found.append((bool(x.get('final')), int(x['step']), KEYS.index(key), name, x))
    if not found:
        return None
    final, step, k, name, x = min(found, key=lambda f: f[:3])
    key = KEYS[k]
    where = 'the final line' if final else f'step {step}'
    more = len(found) - 1
    return f'{key} at {where} of {name} is {x[key]}: a NaN or infinity is a mismatch' + (
        f' ({more} more non-finite figure{"s" * (more > 1)} in the two runs)' if more else ''
    )


def one_run_only(names, va: dict, vb: dict) -> str | None:
    """A note naming the logged steps beyond the last step the other run logged."""
    last = [max((s for s, _ in v), default=0) for v in (va, vb)]
    longer = int(last[1] > last[0])
    beyond = sorted({s for s, _ in (va, vb)[longer] if s > last[1 - longer]})
    if not beyond:
        return None
    return (
        f'note: {len(beyond)} logged step{"s" * (len(beyond) > 1)} in {names[longer]} only '
        f'({beyond[0]}..{beyond[-1]}): {names[1 - longer]} ends at step {last[1 - longer]}; '
        'they are not compared'
    )


def throughput_table(names, finals) -> list[str]:
    units = sorted({k for f in finals for k in f if k.endswith('_per_sec')})
    if not units:
        return []
    width = max(len('run'), *map(len, names))
    rows = [f'{"run":<{width}} ' + ' '.join(f'{u:>16}' for u in units)]
    for name, f in zip(names, finals):
        cells = []
        for u in units:
            v = f.get(u, '-')
            cells.append(f'{v:>16,.0f}' if is_number(v) and math.isfinite(v) else f'{v!s:>16}')
        rows.append(f'{name:<{width}} ' + ' '.join(cells))
    return rows


def policy(names) -> tuple[str, str] | None:
    """(compute, reduce) of the coarser of the two runs' policies (their config.json), or None
    where both are float32 (or unknown): then the fixed limits judge."""
    from shard_parity import numerics

    found = [settings.settings(n) or {} for n in names]
    coarse = numerics.coarsest([numerics.saved(f.get('model_config', {})) for f in found])
    return None if coarse == ('float32', 'float32') else coarse


def main(argv):
    if len(argv) != 3:
        refuse(f'expected two workdirs, got {len(argv) - 1}; {USAGE}')
    names = argv[1], argv[2]
    if same_directory(*names):
        refuse(f'{names[0]} and {names[1]} are the same directory: compare two different runs')
    settings.check_settings(names, ALLOW.value)
    a, b = read(names[0]), read(names[1])
    (va, since_a), (vb, since_b) = figures(a), figures(b)
    parts = pairing.Stretches(*map(settings.settings, names))  # each run's segments
    model = policy(names)
    if model:
        from shard_parity import numerics
    band = f' {"band":>10}' if model else ''
    print(f'{"step":>6} {"figure":<14} {names[0]:>22} {names[1]:>22} {"|difference|":>13}{band}')
    worst, compared, windows, crossing, outside = 0.0, 0, 0, 0, None
    for step, key in sorted(va.keys() & vb.keys(), key=lambda sk: (sk[0], KEYS.index(sk[1]))):
        if heading := parts.heading(step):
            print(heading)
        x, y = va[(step, key)], vb[(step, key)]
        gap = abs(x - y)
        mark = ''
        if kind(key) == 'train' and since_a.get(step) != since_b.get(step):
            mark, windows = ' *', windows + 1  # means over different steps: not a disagreement
        elif math.isfinite(gap):
            worst, compared = max(worst, gap), compared + 1
            parts.record(step, gap)
            if kind(key) == 'train' and parts.crosses(since_a.get(step), step):
                mark, crossing = ' ~', crossing + 1
        cell = ''
        if model and key.endswith('_loss'):  # the band: relative to the figure, widening
            allowed = numerics.band(*model, step) * max(abs(x), abs(y))
            cell = f' {allowed:>10.3g}'
            if not mark.strip() and not gap <= allowed:
                cell += ' !'
                outside = outside or (step, key, gap, allowed)
        print(f'{step:>6} {key:<14} {x:>22.9g} {y:>22.9g} {gap:>13.3g}{cell}{mark}')
    if windows:
        print(
            f'* {windows} train figure{"s" * (windows > 1)} averaged over different steps (the '
            'runs were logged at different --log_every, or one resumed a checkpoint that kept no '
            'averaging window: train_steps_averaged): left out of the verdict'
        )
    if crossing:
        print(
            f'~ {crossing} train figure{"s" * (crossing > 1)} averaged over steps of two segments '
            '(a run moved inside its window): its steps ran under two plans'
        )
    entries = [{(s, kind(k)) for s, k in v} for v in (va, vb)]
    partnered = {(s, kind(k)) for s, k in va.keys() & vb.keys()}
    lonely = [len(e - partnered) for e in entries]
    if any(lonely):
        print(
            f'note: metrics lines with no partner in the other run (not compared): '
            f'{lonely[0]} of {len(entries[0])} in {names[0]}, '
            f'{lonely[1]} of {len(entries[1])} in {names[1]}'
        )
    if only := one_run_only(names, va, vb):
        print(only)
    if problem := non_finite(names, (a, b)):
        refuse(problem, DISAGREE)
    fa, fb = a[-1], b[-1]
    if unfinished := [n for n, f in zip(names, (fa, fb)) if not f.get('final')]:
        refuse(  # an unfinished run has no final verdict to compare: refused input
            f'{" and ".join(unfinished)} {"have" if len(unfinished) > 1 else "has"} no final '
            'line: did it finish? (rerun its train command to resume it)'
        )
    # The MLP's runs end on an accuracy; the transformer's, which has none, on a loss.
    key, limit = (
        ('eval_accuracy', MAX_GAP) if 'eval_accuracy' in fa else ('eval_loss', MAX_LOSS_GAP)
    )
    if ('eval_accuracy' in fa) != ('eval_accuracy' in fb):
        refuse(
            f'only one of {names[0]} and {names[1]} ends with an eval_accuracy: an MLP '
            'run beside a transformer run? Compare runs of the same model.'
        )
    for name, f in zip(names, (fa, fb)):
        if key not in f:
            refuse(f'the final line of {name}/metrics.jsonl has no {key}')
    gap = abs(fa[key] - fb[key])
    limit_text = f'--{limit.name}={limit.value}'
    if model and key == 'eval_loss' and not MAX_LOSS_GAP.present:  # the band's, at the end
        step = max(int(fa['step']), int(fb['step']))
        allowed = numerics.band(*model, step) * max(abs(fa[key]), abs(fb[key]))
        limit_text = f'the {"/".join(model)} band {allowed:.3g} (docs/numerics.md)'
    else:
        allowed = limit.value
    if not compared:
        verdict = 'none in common'
    else:
        verdict = 'bitwise identical' if worst == 0 else f'largest difference {worst:.3g}'
        if parts.moved:  # a run moved meshes: the verdict of each stretch of segments
            verdict += f'; by segment: {parts.verdicts()}'
    at = f' (step {fa["step"]} vs {fb["step"]})' if fa['step'] != fb['step'] else ''
    print(
        f'\nfinal {key}{at} {fa[key]:.4f} vs {fb[key]:.4f} '
        f'(gap {gap:.4f}); every logged figure: {verdict}' + (' where both logged it' if at else '')
    )
    if table := throughput_table(names, (fa, fb)):
        print('\n' + '\n'.join(table))
    if model and not MAX_LOSS_GAP.present:
        print(f'band: two runs that differ only in rounding ({"/".join(model)}, the coarser '
              'policy) stay within it (docs/numerics.md)')  # fmt: skip
    if outside and not MAX_LOSS_GAP.present:
        step, figure, far, allowed_there = outside
        refuse(f'{figure} at step {step} differs by {far:.3g}, outside the band {allowed_there:.3g} '
               f'({far / allowed_there:.3g} bands): more than {"/".join(model)} round-off',
               DISAGREE)  # fmt: skip
    if gap > allowed:
        refuse(f'final {key} values differ by {gap:.4f} > {limit_text}', DISAGREE)
