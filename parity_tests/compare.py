"""Shows, side by side, that two training runs agree: `python -m parity_tests.compare A B`.

    python -m parity_tests.compare runs/auto runs/explicit

Reads each workdir's metrics.jsonl and prints every logged figure of both runs with their
difference. Exits non-zero if the final evaluations differ by more than --max_accuracy_gap (the
MLP's eval_accuracy) or --max_loss_gap (the transformer's eval_loss).
"""

import json
import pathlib
import sys

from absl import app, flags

MAX_GAP = flags.DEFINE_float(
    'max_accuracy_gap',
    0.003,
    'Largest final eval_accuracy difference that counts as agreeing.',
    lower_bound=0,
)
MAX_LOSS_GAP = flags.DEFINE_float(
    'max_loss_gap',
    0.01,
    'Largest final eval_loss difference that counts as agreeing.',
    lower_bound=0,
)
KEYS = ('train_loss', 'eval_loss', 'eval_accuracy')


def read(workdir: str) -> list[dict]:
    path = pathlib.Path(workdir) / 'metrics.jsonl'
    if not path.exists():
        sys.exit(f'error: {path} does not exist: train first with --workdir={workdir}')
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    if not lines:
        sys.exit(f'error: {path} is empty: the run logged nothing (did it fail at the start?)')
    return lines


def main(argv):
    if len(argv) != 3:
        sys.exit('usage: python -m parity_tests.compare WORKDIR_A WORKDIR_B')
    a, b = read(argv[1]), read(argv[2])
    print(f'{"step":>6} {"figure":<14} {argv[1]:>22} {argv[2]:>22} {"|difference|":>13}')
    worst = 0.0
    for x, y in zip(a, b):
        for key in KEYS:
            if key in x and key in y and not x.get('final'):
                gap = abs(x[key] - y[key])
                worst = max(worst, gap)
                print(f'{x["step"]:>6} {key:<14} {x[key]:>22.9g} {y[key]:>22.9g} {gap:>13.3g}')
    fa, fb = a[-1], b[-1]
    if not (fa.get('final') and fb.get('final')):
        sys.exit('error: a run has no final line: did it finish?')
    # The MLP's runs end on an accuracy; the transformer's, which has none, on a loss.
    key, limit = (
        ('eval_accuracy', MAX_GAP) if 'eval_accuracy' in fa else ('eval_loss', MAX_LOSS_GAP)
    )
    if ('eval_accuracy' in fa) != ('eval_accuracy' in fb):
        sys.exit(
            f'error: only one of {argv[1]} and {argv[2]} ends with an eval_accuracy: an MLP run '
            'beside a transformer run? Compare runs of the same model.'
        )
    gap = abs(fa[key] - fb[key])
    verdict = 'bitwise identical' if worst == 0 else f'largest difference {worst:.3g}'
    print(
        f'\nfinal {key} {fa[key]:.4f} vs {fb[key]:.4f} '
        f'(gap {gap:.4f}); every logged figure: {verdict}'
    )
    for name, f in ((argv[1], fa), (argv[2], fb)):
        rate = {k: v for k, v in f.items() if k.endswith('_per_sec')}
        print(f'{name}: {rate}')
    if gap > limit.value:
        sys.exit(f'error: final {key} values differ by {gap:.4f} > --{limit.name}={limit.value}')


if __name__ == '__main__':
    app.run(main)
