"""What the bisector's error model catches, and how often it cries wolf (docs/detection.md):
measured rates, not single cases.

    SHARD_PARITY_DATA_DIR=... python -m benchmarks.detection   # ~35 min on 2 busy cores (NOTES.md)
    python -m benchmarks.detection --seeds=1 --steps=5 --window=2 --sizes=0.01  # a smoke run
    python -m benchmarks.detection --json=benchmarks/results/detection/rates.json

False alarms: a correct pair (one device against explicit/dp.py on data:N, the tiny transformer,
bf16 compute) judged step by step for --steps steps from two states of each of --seeds seeds:
the seed's initialisation and a short trained run's (--trained steps of one device, float32).
Each step is judged as the bisector judges it (tools/bisect/stepping.py's compare_step, the
error model), and the walk goes on past an alarm from A's state, so every step is one trial.
Detection: a planted effect of each size in --sizes, in each of --families, against its
reference, judged on --window steps from each state and seed: the share of those steps where
the model catches it (the size: the relative change planted in the leaves it moves).

The zoo's small-effect entries are judged by the same code (benchmarks/judging.py; the tests:
parity_tests/test_detection.py): float32 and bf16, at step 0 and from a trained state.
"""

import dataclasses
import json
import math
import sys
import time

from benchmarks.judging import Case, Pair, inputs, trained
from shard_parity import refuse

FAMILIES = {  # a planted effect of relative size s: (zoo entry, module constant, its value)
    'grads_scaled': ('SCALE', lambda s: 1 - s),  # every gradient leaf (1 - s) x the right one
    'update_1pct': ('FACTOR', lambda s: 1 + s),  # every parameter's step (1 + s) x the right one
}


def states(case: Case, seeds, trained_steps: int):
    """(seed, label, start, state) for each seed: its initialisation's and its trained run's."""
    import jax
    import numpy as np

    for seed in seeds:
        yield seed, 'step 0', 0, jax.tree.map(np.asarray, inputs(case, seed)[3])
        yield seed, f'trained {trained_steps}', trained_steps, trained(case, seed, trained_steps)


def false_alarms(case: Case, seeds, trained_steps: int, steps: int, bar) -> dict:
    """A correct pair walked `steps` steps from each state: per state, the steps, the alarms
    ([seed, step, phase, leaf, budgets]) and each step's largest fraction of a budget."""
    pair, out = Pair('one_device', 'explicit', case), {}
    for seed, label, start, state in states(case, seeds, trained_steps):
        walked = pair.walk(state, inputs(case, seed)[4], start, steps, bar)
        row = out.setdefault(label, {'steps': 0, 'alarms': [], 'worst': []})
        row['steps'] += len(walked)
        row['alarms'] += [[seed, s.step, s.phase, s.path, s.budgets] for s in walked if s.phase]
        row['worst'] += [s.worst for s in walked]
    return out


def detection(case: Case, family: str, size: float, seeds, trained_steps, window, bar) -> dict:
    """The entry `family` planted at relative size `size`, against explicit/dp.py, walked
    `window` steps from each state: per state, the steps, those caught, and where not caught
    the smallest detection limit of the phase it moves (gradients or update)."""
    import importlib

    module = importlib.import_module(f'tools.zoo.{family}')
    name, value = FAMILIES[family]
    saved = getattr(module, name)
    setattr(module, name, value(size))  # read as the entry's step traces: each Pair compiles
    phase = 'gradients' if family == 'grads_scaled' else 'update'
    try:
        pair = Pair('explicit', f'tools.zoo.{family}', case)
        out = {}
        for seed, label, start, state in states(case, seeds, trained_steps):
            walked = pair.walk(state, inputs(case, seed)[4], start, window, bar)
            row = out.setdefault(label, {'steps': 0, 'caught': 0, 'limits': []})
            row['steps'] += len(walked)
            row['caught'] += sum(s.phase is not None for s in walked)
            for s in walked:
                said = (getattr(s.report, 'limits', None) or {}).get(phase)
                rows = said.values() if said else [b for p, _, _, b in s.rows if p == phase]
                row['limits'] += [min(rows)] if s.phase is None and rows else []
        return out
    finally:
        setattr(module, name, saved)


def merged(results: list[dict]) -> dict:
    """Runs of other seeds (--first_seed) as one: their steps, alarms and catches added."""
    out = json.loads(json.dumps(results[0]))
    for r in results[1:]:
        out['seeds'] += r['seeds']
        out['seconds'] = max(out['seconds'], r['seconds'])  # (run side by side)
        for label, row in r['false_alarms'].items():
            mine = out['false_alarms'][label]
            for k in ('steps', 'alarms', 'worst'):
                mine[k] += row[k]
        for family, by_size in r['detection'].items():
            for size, by_state in by_size.items():
                for label, row in by_state.items():
                    mine = out['detection'][family][size][label]
                    for k in ('steps', 'caught', 'limits'):
                        mine[k] += row[k]
    return out


def main(argv):
    import tqdm
    from absl import flags, logging

    f = flags.FLAGS
    if len(argv) > 1:
        refuse(f'unexpected arguments {argv[1:]}: every setting is a --flag')
    logging.set_verbosity(logging.WARNING)  # optax's schedule notes at INFO
    if f.merge:
        result = merged([json.load(open(path)) for path in f.merge])
        return done(result, f.json)
    from shard_parity.devices import configure_jax

    configure_jax(f.devices)
    sizes = [float(x) for x in f.sizes]
    seeds = list(range(f.first_seed, f.first_seed + f.seeds))
    total = len(seeds) * 2 * (f.steps + len(sizes) * len(f.families) * f.window)
    t0, case = time.monotonic(), Case(axes=(('data', f.devices), ('model', 1)))
    result = {'case': dataclasses.asdict(case), 'seeds': seeds, 'steps': f.steps,
              'trained': f.trained, 'window': f.window, 'detection': {}}  # fmt: skip
    with tqdm.tqdm(total=total, unit='step', file=sys.stderr) as bar:
        result['false_alarms'] = false_alarms(case, seeds, f.trained, f.steps, bar)
        for family in f.families:
            for size in sizes:  # each written as it is measured: a run cut short keeps them
                result['seconds'] = round(time.monotonic() - t0)
                save(result, f.json)
                found = detection(case, family, size, seeds, f.trained, f.window, bar)
                result['detection'].setdefault(family, {})[f'{size:g}'] = found
    result['seconds'] = round(time.monotonic() - t0)
    done(result, f.json)


def save(result: dict, path: str | None):
    if path:
        with open(path, 'w') as out:
            json.dump(result, out, indent=1)


def done(result: dict, path: str | None):
    save(result, path)
    print(table(result))


def percentile(values, q):
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))] if ordered else math.nan


def table(r: dict) -> str:
    seeds, lines = len(r['seeds']), []
    mesh = ','.join(f'{a}:{n}' for a, n in r['case']['axes'])
    lines.append(f"false alarms: one_device vs explicit dp {mesh}, bf16, {seeds} seeds x "
                 f"{r['steps']} steps from each state ({r['seconds']} s)")  # fmt: skip
    for label, row in r['false_alarms'].items():
        w = row['worst']
        lines.append(f"  {label:>12}: {len(row['alarms'])} alarms in {row['steps']} steps; each "
                     f"step's largest fraction of a budget: median {percentile(w, 0.5):.3g}, "
                     f"99th percentile {percentile(w, 0.99):.3g}, max {max(w):.3g}")  # fmt: skip
    lines.append(f"detection: steps caught ({seeds} seeds x {r['window']} steps per state); "
                 'where not, the median detection limit of the phase it moves')  # fmt: skip
    for family, by_size in r['detection'].items():
        for size, by_state in by_size.items():
            cells = [f"{label} {row['caught']}/{row['steps']}"
                     + (f" (limit {percentile(row['limits'], 0.5):.2g})" if row['limits'] else '')
                     for label, row in by_state.items()]  # fmt: skip
            lines.append(f'  {family} {float(size):>6.2%}: ' + '; '.join(cells))
    return '\n'.join(lines)


def define_flags():
    from absl import flags

    flags.DEFINE_integer(
        'seeds', 3, 'How many seeds (initialisation and batch order).', lower_bound=1
    )
    flags.DEFINE_integer(
        'first_seed', 0, 'The first seed (runs side by side: --merge).', lower_bound=0
    )
    flags.DEFINE_integer(
        'devices', 2, "Emulated CPU devices: the pair's mesh is data:N (8 run several times slower)",
        lower_bound=1,
    )  # fmt: skip
    flags.DEFINE_integer('steps', 200, 'Steps of the correct pair from each state.', lower_bound=1)
    flags.DEFINE_integer('trained', 300, 'Steps of one device before the trained state.',
                         lower_bound=1)  # fmt: skip
    flags.DEFINE_integer(
        'window', 4, 'Steps of each planted effect from each state.', lower_bound=1
    )
    flags.DEFINE_list('sizes', ['0.01', '0.03', '0.1', '0.3'],
                      'Relative sizes of the planted effects.')  # fmt: skip
    flags.DEFINE_multi_enum('families', list(FAMILIES), list(FAMILIES), 'The planted effects.')
    flags.DEFINE_string('json', None, 'Write the rates to this file as JSON (as they come).')
    flags.DEFINE_list('merge', None, 'JSON files of runs of other seeds: print them as one.')


if __name__ == '__main__':
    from absl import app

    define_flags()
    app.run(main)
