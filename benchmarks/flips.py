"""How far a bf16 dp pair's gradients are apart, leaf by leaf, against the bisector's flip
estimate from side A alone (tools/bisect/budgets.py's `flips`; docs/numerics.md, "Flips
under dp"): what C_FLIP was chosen from.

    SHARD_PARITY_DATA_DIR=... python -m benchmarks.flips --first_seed=3   # ~3 min idle
    python -m benchmarks.flips --seeds=1 --steps=2 --trained=20          # a smoke run

One device against explicit/dp.py on data:N, the tiny transformer (benchmarks/judging.py's
Case), bf16, walked --steps steps from each seed's initialisation and from its state after
--trained steps of one device, each step from A's state: per leaf the norm-wise error between
the sides' gradients, the probes' noise with the rows cut (probes.measure, rows=N) and with
every site jittered (rows=0), and the error over the flip estimate (budgets.flips). A step's
leaf counts as flipped where its error is over FLIPPED times the cut rows' noise. Last, per
state (a seed's step), the sides' error over the estimate where only the rows are cut,
budgets.C_EST x the cut rows' noise (`calibration`: issue 52's item 3 under dp): in [0.3, 3] on
90% of the leaves or more, unless a leaf flipped.
"""

import json
import math
import sys
import time

from benchmarks.judging import Case, Pair, inputs, trained
from shard_parity import refuse

FLIPPED = 20  # an error this many times the cut rows' noise (or 1e-7) is a flip's


def flipped(error: float, cut: float) -> bool:
    """Whether a leaf's error is a flip's: over FLIPPED times the cut rows' noise, or 1e-7."""
    return error > FLIPPED * max(cut, 1e-7)


def walk(pair: Pair, seed: int, label: str, start: int, state, steps: int, rows: list,
         jittered: bool = True):  # fmt: skip
    """`steps` steps of `pair` from `state`, each from A's state after the last: a row [seed,
    label, step, leaf, error, cut, jittered] per leaf and step (jittered None where
    `jittered` is off: the cut rows' probes alone)."""
    import jax
    import numpy as np

    from shard_parity import numerics
    from tools.bisect import probes
    from tools.bisect.leaves import named_leaves

    graphdef, loss_fn, _, _, batches, _, _ = inputs(pair.case, seed)
    a, b = pair.runners
    blocks = dict(pair.case.axes)['data']
    for i in range(start, start + steps):
        batch = batches.batch(i)
        (_, ga), (_, gb) = a.loss_and_grads(state, batch), b.loss_and_grads(state, batch)
        cut = probes.measure(graphdef, loss_fn, state.params, batch, rows=max(blocks, 2))[1]
        jit = [None] * len(cut)
        if jittered:
            jit = probes.measure(graphdef, loss_fn, state.params, batch, rows=0)[1]
        pairs = zip(named_leaves(ga), named_leaves(gb), cut, jit, strict=True)
        for (path, x), (_, y), c, j in pairs:
            error = numerics.error(np.asarray(x, np.float64), np.asarray(y, np.float64))
            rows.append([seed, label, i, path, error, c, j])
        if i + 1 < start + steps:
            state = jax.device_get(a.train_step(state, batch)[0])


def states(rows: list) -> dict:
    """{(seed, label, step): [(leaf, error over its estimate, flipped)]}: the estimate where
    the sides split only the rows, C_EST x the noise of the probes that cut them (budgets'
    own; an error of 0 reads 0, as pos.embedding's often is: both sides exact); flipped where
    the error is over FLIPPED times that noise (or float32's 1e-7). A flip is not in the
    estimate: C_FLIP's term of the budget bounds it as a tail (`table`)."""
    from tools.bisect import budgets

    out = {}
    for seed, label, i, path, error, cut, _ in rows:
        estimate = budgets.C_EST * cut
        ratio = error / estimate if estimate else (0.0 if not error else math.inf)
        out.setdefault((seed, label, i), []).append((path, ratio, flipped(error, cut)))
    return out


def inside(leaves: list, low: float = 0.3, high: float = 3.0) -> float:
    """The share of a state's leaves whose error over the estimate lies in [low, high] (issue
    52's item 3 asks 90% or more)."""
    return sum(low <= r <= high for _, r, _ in leaves) / max(len(leaves), 1)


def calibration(rows: list) -> str:
    """Per label (the seeds' initialisation, their trained state): how many of its states
    (seed and step) flip, the share of the others with 90% of their leaves or more in [0.3, 3],
    the least share among them, and their ratios' median."""
    import numpy as np

    lines, by = ["error / (C_EST x the cut rows' noise), per state (a seed's step):"], states(rows)
    for label in dict.fromkeys(row[1] for row in rows):
        found = [v for k, v in by.items() if k[1] == label]
        calm = [v for v in found if not any(f for _, _, f in v)]
        shares = [inside(v) for v in calm] or [float('nan')]
        median = np.median([r for v in calm for _, r, _ in v]) if calm else float('nan')
        lines.append(f'  {label}: {len(found) - len(calm)} of {len(found)} states flip; of the '
                     f'others {np.mean([x >= 0.9 for x in shares]):.0%} have 90% of their leaves '
                     f'or more in [0.3, 3] (least {min(shares):.0%}), median ratio {median:.2f}')  # fmt: skip
    return '\n'.join(lines)


def table(rows: list, compute: str = 'bfloat16') -> str:
    """Per leaf: the error over the flip estimate (largest, 99th percentile, median), how often
    a flip; then over the flipped leaf-steps alone."""
    import numpy as np

    from tools.bisect import budgets

    factor, lines = budgets.flip(compute), []
    ratio = {}
    for _, _, _, path, error, cut, jittered in rows:
        ratio.setdefault(path, []).append((error / (factor * jittered), flipped(error, cut)))
    steps = len(rows) // max(len(ratio), 1)
    lines.append(f'{steps} steps; error / flip estimate (2^-7 x the jittered noise), per leaf:')
    for path, pairs in ratio.items():
        r = np.array([x for x, _ in pairs])
        share = np.mean([f for _, f in pairs])
        lines.append(f'  {path:30s} max {r.max():6.3f}  99th {np.quantile(r, 0.99):6.3f}  '
                     f'median {np.median(r):7.4f}  flipped {share:.1%}')  # fmt: skip
    flips = np.array([x for pairs in ratio.values() for x, f in pairs if f])
    if flips.size:
        q = np.quantile(flips, [0.5, 0.9, 0.99, 1.0])
        lines.append(f'flipped leaf-steps ({flips.size}): median {q[0]:.3f}, 90th {q[1]:.3f}, '
                     f'99th {q[2]:.3f}, max {q[3]:.3f}; C_FLIP = {budgets.C_FLIP:g}')  # fmt: skip
    return '\n'.join(lines)


def main(argv):
    from absl import flags, logging

    f = flags.FLAGS
    if len(argv) > 1:
        refuse(f'unexpected arguments {argv[1:]}: every setting is a --flag')
    logging.set_verbosity(logging.WARNING)
    from shard_parity.devices import configure_jax

    configure_jax(f.devices)
    import jax
    import numpy as np

    case, rows, t0 = Case(axes=(('data', f.devices), ('model', 1))), [], time.monotonic()
    pair = Pair('one_device', 'explicit', case)
    for seed in range(f.first_seed, f.first_seed + f.seeds):
        start = jax.tree.map(np.asarray, inputs(case, seed)[3])
        walk(pair, seed, 'step 0', 0, start, f.steps, rows)
        walk(pair, seed, f'trained {f.trained}', f.trained, trained(case, seed, f.trained),
             f.steps, rows)  # fmt: skip
        print(f'seed {seed}: {time.monotonic() - t0:.0f} s', file=sys.stderr)
    if f.json:
        with open(f.json, 'w') as out:
            json.dump(rows, out)
    print(table(rows))
    print(calibration(rows))


def define_flags():
    from absl import flags

    flags.DEFINE_integer('seeds', 3, 'How many seeds.', lower_bound=1)
    flags.DEFINE_integer('first_seed', 3, 'The first seed (0-2: the rates of benchmarks.detection).',
                         lower_bound=0)  # fmt: skip
    flags.DEFINE_integer('devices', 2, "Emulated CPU devices: the mesh is data:N.", lower_bound=2)
    flags.DEFINE_integer('steps', 100, 'Steps from each state.', lower_bound=1)
    flags.DEFINE_integer('trained', 300, 'Steps of one device before the trained state.',
                         lower_bound=1)  # fmt: skip
    flags.DEFINE_string('json', None, 'Write every leaf-step as JSON.')


if __name__ == '__main__':
    from absl import app

    define_flags()
    app.run(main)
