"""Records the one-device programs of one v5e chip as the TPU compiler predicts them from shapes on
this host, and, once inspector.sh has run on a chip, as the chip's own compile gave them (issue
53, item 5): benchmarks/results/tpu/inspector_chip.json, which
parity_tests/test_inspector_chip.py holds a fresh compile from shapes against; the Markdown table
of docs/inspector.md on stdout.

    python -m inspector FLAGS --strategy=dp --target=tpu-v5e-1 --json > SHAPES/inspector_NAME.json
    python -m benchmarks.results.tpu.record_inspector SHAPES_DIR [CHIP_DIR]
    python -m benchmarks.results.tpu.record_inspector - CHIP_DIR   # the recorded shapes' side

FLAGS and NAME: benchmarks/chip.py's INSPECTOR_FLAGS. CHIP_DIR holds inspector.sh's
inspector_NAME.json (compiled on the chip, with --measure_memory) and inspector_date.txt.
"""

import importlib.metadata
import json
import pathlib
import sys
import time

import jax

from benchmarks.chip import INSPECTOR_FLAGS
from shard_parity.inspector.measured import FIELDS, disagreements, figures

OUT = pathlib.Path(__file__).parent / 'inspector_chip.json'


def mib(b) -> str:
    return f'{b / 2**20:,.2f}'


def read(folder: pathlib.Path, name: str) -> dict:
    return figures(json.loads((folder / f'inspector_{name}.json').read_text()))


def row(name: str, program: str, s: dict, c: dict | None) -> str:
    """One program: the prediction from shapes; the chip's figure beside each that differs."""
    cells = [mib(s[k]) + ('' if c is None or c[k] == s[k] else f' (chip {mib(c[k])})')
             for k in FIELDS]  # fmt: skip
    n = len(s['collectives'])
    m = (c or {}).get('measured')
    return (
        f"| {name} | {program} | {' | '.join(cells)} | {n} | "
        + ('pending' if c is None else 'equal' if not disagreements({0: c}, {0: s}) else 'differ')
        + ' | '
        + (f"{mib(m['peak'])} ({m['peak'] - c['compiler_peak']:+,} B)" if m else '-')
        + ' |'
    )


def main(shapes_dir: str, chip_dir: str | None) -> None:
    """SHAPES_DIR '-': the shapes' side as inspector_chip.json recorded it (its machine kept)."""
    recorded = json.loads(OUT.read_text()) if shapes_dir == '-' else None
    configs, rows = {}, []
    for name, flags in INSPECTOR_FLAGS.items():
        found = pathlib.Path(shapes_dir) / f'inspector_{name}.json'
        if recorded is None and (not found.exists() or not found.stat().st_size):
            print(f'{name}: not compiled from shapes yet, left out', file=sys.stderr)
            continue
        if recorded is not None and name not in recorded['configs']:
            continue
        shapes = recorded['configs'][name]['shapes'] if recorded else read(pathlib.Path(shapes_dir), name)
        chip = read(pathlib.Path(chip_dir), name) if chip_dir else None
        bare = chip and {p: {k: v for k, v in f.items() if k != 'measured'} for p, f in chip.items()}
        configs[name] = {
            'flags': flags, 'shapes': shapes, 'chip': chip,
            'expected_disagreements': disagreements(bare, shapes) if chip else None,
        }  # fmt: skip
        rows += [row(name, p, shapes[p], chip and chip.get(p)) for p in shapes]
    here = {'host': 'CPU, compiled for --target=tpu-v5e-1', 'jax': jax.__version__,
            'libtpu': importlib.metadata.version('libtpu'),
            'date': time.strftime('%Y-%m-%d', time.gmtime())}  # fmt: skip
    chip_text = chip_dir and ''.join(  # libtpu's start-up warning left out
        line for line in (pathlib.Path(chip_dir) / 'inspector_date.txt').open()
        if 'warn' not in line.lower()
    )  # fmt: skip
    machine = {'shapes': recorded['machine']['shapes'] if recorded else here, 'chip': chip_text or None}
    OUT.write_text(json.dumps({'machine': machine, 'configs': configs}, indent=1) + '\n')
    print('| config | program | arguments | outputs | aliased | temp | compiler peak | '
          'collectives | on the chip | measured peak (− compiler) |')  # fmt: skip
    print('| --- | --- |' + ' ---: |' * 6 + ' --- | ---: |')
    print('\n'.join(rows))
    for name, c in configs.items():
        for line in c['expected_disagreements'] or []:
            print(f'- {name}: {line}')


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
