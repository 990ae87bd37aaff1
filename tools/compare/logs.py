"""The runs' logs as compare reads them (`python -m tools.compare A B`, tools/compare/cli.py):
each workdir's metrics.jsonl, its figures by step, and the notes and tables printed beside the
comparison. Unparsable (torn or garbled) lines are skipped with one warning; a workdir is only
read.
"""

import json
import math
import pathlib
import sys

from shard_parity import refuse

from . import pairing

KEYS = ('train_loss', 'eval_loss', 'eval_accuracy')


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
