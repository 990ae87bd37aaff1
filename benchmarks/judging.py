"""Two sides of a comparison judged step by step as the bisector judges them (tools/bisect's
compare_step), every leaf's error and detection limit kept: benchmarks/detection.py's rates
and parity_tests/test_detection.py's small-effect zoo entries (docs/detection.md).

A Case is the tiny transformer (benchmarks/numerics.py's) on a mesh under a policy; `trained`
is a short run of one device from a seed; a Pair compiles two sides once and judges any step
from any state (`judge`), or walks on past a verdict (`walk`); `verdict` measures a zoo entry
against its reference in float32 and in the case's policy, at step 0 and from a trained state.
"""

import contextlib
import dataclasses
import functools
import inspect

TRANSFORMER = dict(seq_len=16, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32)
DP8 = (('data', 8), ('model', 1))
TRAINED = 100  # the tests' short trained run: one device, float32, from the seed


@dataclasses.dataclass(frozen=True)
class Case:
    """One comparison's setting: the tiny transformer (benchmarks/numerics.py's) on a mesh, its
    policy, its batch; warm-up 0, so that step 0 moves the parameters (the transformer's
    default warm-up starts at a learning rate of 0, where no update-phase bug can show)."""

    strategy: str = 'dp'
    axes: tuple = DP8
    compute: str = 'bfloat16'
    reduce: str = 'float32'
    batch: int = 16
    microbatches: int = 4

    def precise(self) -> 'Case':
        return dataclasses.replace(self, compute='float32', reduce='float32')


PP16 = Case('pp', (('data', 4), ('stage', 2)), batch=64, microbatches=16)  # 16 per 'data' row


@functools.lru_cache(maxsize=8)
def inputs(case: Case, seed: int = 0):
    """(graphdef, loss_fn, tx, state, batches, plan, mesh) of `case` under `seed` (the
    initialisation and the batches' order), as the bisector's flags build them."""
    from flax import nnx
    from jax.sharding import AxisType

    from shard_parity import config as cfg
    from shard_parity import plan as plans
    from shard_parity.mesh import mesh_for
    from shard_parity.runtime import tasks
    from shard_parity.step import create_state, make_optimizer

    plan = plans.from_config({
        'strategy': case.strategy, 'mesh': dict(case.axes), 'microbatches': case.microbatches,
        'model_config': {'dtype': case.compute, 'reduce_dtype': case.reduce},
    })  # fmt: skip
    config = dataclasses.replace(
        cfg.TRAIN_DEFAULTS['transformer'], batch_size=case.batch, seed=seed, warmup_steps=0
    )
    shape = cfg.TransformerConfig(**TRANSFORMER, dtype=case.compute, reduce_dtype=case.reduce)
    task = tasks.shakespeare_task(config, shape, None, False)
    tx = make_optimizer(config)
    graphdef, state = create_state(task.make_model(nnx.Rngs(config.seed)), tx)
    mesh = mesh_for(plan, AxisType.Auto)
    return graphdef, task.loss_fn, tx, state, task.train_batches, plan, mesh


@functools.lru_cache(maxsize=8)
def trained(case: Case, seed: int, steps: int):
    """The state after `steps` steps of one device in float32 from `seed`'s initialisation, on
    the batches 0..steps-1 (as the train loop takes them): a short trained run's, as numpy."""
    import jax
    import numpy as np

    from tools.bisect import divergence as D

    graphdef, loss_fn, tx, state, batches, plan, _ = inputs(case.precise(), seed)
    one = D.Runner(D.load_side('one_device', plan, None), graphdef, loss_fn, tx)
    state = jax.tree.map(np.asarray, state)
    for i in range(steps):
        state, _ = one.train_step(state, batches.batch(i))
    return state


@dataclasses.dataclass
class Step:
    """One judged step: the phase caught (None: within every budget), the first leaf caught
    and its budgets, the largest fraction of a budget seen, and every leaf compared as
    (phase, path, norm-wise error, budget)."""

    step: int
    phase: str | None
    path: str | None = None
    budgets: float | None = None
    error: float | None = None
    worst: float = 0.0
    rows: list = dataclasses.field(default_factory=list, repr=False)
    report: object = dataclasses.field(default=None, repr=False)  # the bisector's Report

    after: object = dataclasses.field(default=None, repr=False)  # A's state after it (agreed)

    def limit(self, phase: str, path: str) -> float | None:
        """The detection limit of that leaf: the smallest norm-wise error the model would call
        a difference there (its budget), as the report says it (Report.limits) or as
        recorded."""
        said = (getattr(self.report, 'limits', None) or {}).get(phase) or {}
        name = path.removeprefix('B: ')  # the update's limits: B's own step, by its leaf
        if name in said:
            return said[name]
        return next((b for p, q, _, b in self.rows if (p, q) == (phase, path)), None)


@contextlib.contextmanager
def budgets_recorded():
    """Every leaf the bisector compares under the error model, as (phase, path, norm-wise
    error, budget), into the list it yields (leaves.compare wrapped while it is open)."""
    import importlib
    import importlib.util

    from shard_parity import numerics
    from tools.bisect import leaves

    rows, original = [], leaves.compare
    modules = [importlib.import_module(f'tools.bisect.{m}') for m in ('stepping', 'budgets')
               if importlib.util.find_spec(f'tools.bisect.{m}')]  # fmt: skip
    modules = [leaves] + [m for m in modules if getattr(m, 'compare', None) is original]
    signature = inspect.signature(original)

    def compare(*args, **kwargs):
        given = signature.bind(*args, **kwargs).arguments
        if given.get('budget') is not None:
            phase = getattr(given.get('seen'), 'phase', '?')
            error = numerics.error(given['a'], given['b'])
            rows.append((phase, given['path'], error, given['budget']))
        return original(*args, **kwargs)

    for m in modules:
        m.compare = compare
    try:
        yield rows
    finally:
        for m in modules:
            m.compare = original


class Pair:
    """Two sides of one case, compiled once, judged step by step from any state (`judge`)."""

    def __init__(self, a: str, b: str, case: Case):
        from tools.bisect import divergence as D

        graphdef, loss_fn, tx, _, _, plan, mesh = inputs(case)
        self.sides = [D.load_side(name, plan, mesh) for name in (a, b)]
        self.runners = [D.Runner(s, graphdef, loss_fn, tx, label)
                        for s, label in zip(self.sides, 'AB')]  # fmt: skip
        self.apply, self.case = D.shared_update(tx), case

    def judge(self, state, batch, step: int, tolerance: str | None = None) -> Step:
        """`step` on `batch` from `state`: the bisector's verdict at `tolerance` (None: its
        default for the pair), each leaf's error and budget recorded."""
        from tools.bisect import divergence as D
        from tools.bisect.stepping import compare_step

        report = D.new_report(*self.sides, tolerance)
        with budgets_recorded() as rows:
            phase, layer, out = compare_step(*self.runners, self.apply, state, batch,
                                         report.tolerance, report, step)  # fmt: skip
        worst = max((f for _, _, f in report.seen), default=0.0)
        report.steps = 1
        if phase is None:
            return Step(step, None, worst=worst, rows=rows, report=report, after=out)
        D._diverged(report, step, phase, layer, out, *self.sides)
        leaf = out[0]
        return Step(step, phase, leaf.path, leaf.budgets, leaf.error, worst, rows, report)

    def walk(self, state, batches, start: int, steps: int, bar=None) -> list[Step]:
        """`steps` steps from `state` at `start`, each judged and each followed from A's state
        after it, whatever the verdict (every step a trial)."""
        out = []
        for i in range(start, start + steps):
            batch = batches.batch(i)
            judged = self.judge(state, batch, i)
            out.append(judged)
            after = judged.after
            state = after if after is not None else self.runners[0].train_step(state, batch)[0]
            judged.after = None
            if bar is not None:
                bar.update()
        return out


def verdict(entry: str, reference: str, case: Case, trained_steps: int = TRAINED) -> dict:
    """A zoo entry against its reference, in float32 and in `case`'s policy, at step 0 and from
    a short trained run: {state: {'f32': Step (the bisector's f32 tolerance), 'effect': Step
    (float32 under the error model: the first leaf caught, its norm-wise error), 'model':
    Step (`case`'s policy, the error model)}}; state 'step 0' or 'trained N'."""
    import jax
    import numpy as np

    precise, coarse = Pair(reference, entry, case.precise()), Pair(reference, entry, case)
    out = {}
    for label, start in (('step 0', 0), (f'trained {trained_steps}', trained_steps)):
        state = trained(case, 0, start) if start else jax.tree.map(np.asarray, inputs(case)[3])
        batch = inputs(case)[4].batch(start)
        out[label] = {
            'f32': precise.judge(state, batch, start, 'f32'),
            'effect': precise.judge(state, batch, start, 'model'),
            'model': coarse.judge(state, batch, start),
        }
    return out


def summary(found: dict) -> dict:
    """`verdict`'s answer as plain numbers: per state the f32 verdict, the effect (phase, leaf,
    error) and the bf16 verdict (caught: budgets; within: the detection limit at that leaf)."""
    out = {}
    for label, v in found.items():
        effect, model = v['effect'], v['model']
        limit = model.limit(effect.phase, effect.path) if effect.phase else None
        out[label] = {
            'f32': v['f32'].phase or 'agrees', 'phase': effect.phase, 'leaf': effect.path,
            'effect': effect.error, 'model': model.phase or 'within',
            'budgets': model.budgets, 'limit': limit,
        }  # fmt: skip
    return out
