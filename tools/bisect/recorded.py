"""A run from another machine: `python -m tools.bisect RUN_A RUN_B` where one run trained on
another platform than this host (its config.json's segments record `platform` and
`device_kind`: a TPU chip beside this CPU), or where --recorded=A|B says which.

That side is recorded: its steps are not replayed here, which could not show what its machine
computed. Its step s -> s+1 is read from its checkpoints s and s+1 (both must be saved: train it
with --checkpoint_every=1, and --save_initial for step 0); the other side, live, runs step s
here from the recorded side's state s on the same batch (batch s, as the train loop takes it,
shard_parity/runtime/loop.py), with its own twin, plan and mesh. The two steps are then judged
leaf by leaf as the update phase is (tools/bisect/budgets.py: each leaf's step, new minus old,
against the other's, norm-wise, relative to the step's size), under the error model of the
coarser of the two sides' arithmetic: a recorded float32 run that ran on a TPU at
--matmul_precision=default computed its dots in one bfloat16 pass (tools/compare/pairing.py's
`precision`), so bf16's; at `high` or `highest`, float32's. No gradient of the recorded side
exists, so the gradients' budgets come from the live side's probes (tools/bisect/probes.py),
run on the model at that coarser compute dtype with every site jittered (another machine's
compiler fuses each row's ops its own way) and floored at the error model's flat budget. The
live side's own step is also held to the shared optimizer applied to its own gradient, as in
every bisect. Each step starts again from the recorded side's checkpoint, so no drift adds up.
Where the recorded run's metrics.jsonl logged step s's loss alone (a train line at s+1 over
that one step: --log_every=1), that loss is held first to the live loss at the loss phase's
budget (the error model's carried rounding, or the probes' spread of the loss): the recorded
machine's forward pass, seen through its one logged figure.
"""

import dataclasses
import math
import pathlib

import jax
import numpy as np

from shard_parity import UsageError, numerics
from shard_parity import config as cfg
from shard_parity.devices import use_matmul_precision
from shard_parity.runtime import checkpoint, segments
from shard_parity.runtime.saved import abstract_state
from shard_parity.step import make_optimizer

from ..compare import pairing
from . import budgets, probes, trained
from . import divergence as D
from .leaves import compare, compare_trees, named_leaves
from .stepping import Runner, Seen

LABELS = 'AB'


def host() -> str:
    """This host's platform, as a segment records it ('cpu', 'tpu', 'gpu')."""
    return jax.default_backend()


def away(saved: dict) -> list[dict]:
    """The segments of a run that trained on another platform than this host's (a segment
    saved before platforms were recorded: this host's)."""
    return [s for s in segments.of(saved) if s.get('platform') not in (None, host())]


def which(saved_a: dict, saved_b: dict, given: str | None) -> tuple[int | None, list[str]]:
    """(the recorded side's index, 0 for A or 1 for B, or None: both replayed here; notes).
    --recorded names it; else the one run that trained elsewhere."""
    if given:
        return LABELS.index(given), []
    elsewhere = [bool(away(s)) for s in (saved_a, saved_b)]
    if elsewhere.count(True) == 1:
        return elsewhere.index(True), []
    if all(elsewhere):
        where = sorted({where_of(s) for saved in (saved_a, saved_b) for s in away(saved)})
        return None, [
            f'both runs trained on another platform than this host ({", ".join(where)}; here '
            f'{host()}): both replayed here, which shows what this host computes of their '
            'steps, not what theirs did; --recorded=A (or B) reads that run\'s steps from its '
            'checkpoints instead'
        ]
    return None, []


def where_of(segment: dict) -> str:
    kind = segment.get('device_kind')
    return (
        f"{segment['platform']} ({kind})"
        if kind not in (None, segment['platform'])
        else (segment['platform'])
    )


def assumed(segment: dict) -> tuple[tuple[str, str], str]:
    """((compute, reduce) the recorded side's arithmetic is judged as, the words that say so)."""
    compute, reduce = pairing.precision(segment)
    p = segment.get('precision') or {}
    said, matmul = p.get('compute', 'float32'), p.get('matmul', 'default')
    if pairing.bf16_dots(segment) and said == 'float32':
        why = 'float32 at --matmul_precision=default, one bfloat16 pass per dot: assumed bfloat16'
    elif said == 'float32' and segment.get('platform') == 'tpu':
        why = f'float32 at --matmul_precision={matmul}: assumed float32'
    else:
        why = f'assumed {compute}'
    reduced = f', {reduce} reduce' if reduce != 'float32' else ''
    return (compute, reduce), f'{why} compute{reduced}'


def chosen(run: str, label: str, others: tuple, begin, part, steps) -> tuple[int, int]:
    """(s, how many steps) of the recorded run `run`: --from=RUN@s, else the newest s with
    checkpoints s and s+1 before the logs part at `part` (the newest of all where they do
    not, the first after it where none is before); each step s..s+n-1 needs both its
    checkpoints, refused in one line otherwise."""
    saved = checkpoint.steps(run)
    what = f'{label}={run} is recorded, its steps read from its checkpoints'
    train = 'train it with --checkpoint_every=1 (--save_initial saves step 0)'
    pairs = [s for s in saved if s + 1 in saved]
    if begin:
        workdir, start = trained.parse(begin)
        runs = {pathlib.Path(r).resolve() for r in others}
        if (workdir and pathlib.Path(workdir).resolve() not in runs) or start is None:
            raise UsageError(
                f'--from={begin}: with a recorded run --from picks the step it judges: give '
                f'--from={run}@STEP, STEP one of {pairs or "none"} (STEP+1 saved too)'
            )
    elif not pairs:
        raise UsageError(
            f'{what}, two in a row (s and s+1), and it saved {saved or "none"}: {train}'
        )
    else:
        before = [s for s in pairs if part is None or s < part]
        start = before[-1] if before else pairs[0]  # none before: the nearest after
    n = steps or 1
    missing = [s for s in range(start, start + n + 1) if s not in saved]
    if missing:
        raise UsageError(
            f'{what}: step {start} -> {start + n} needs checkpoints {start}..{start + n}, and it '
            f'saved {saved or "none"} (not {missing[0]}): {train}'
        )
    return start, n


def bisect(runs_given, saved, lines, part, which_side, tolerance, steps, begin, made) -> D.Report:
    """The report of the recorded side `which_side` (0: A, 1: B) against the other, live, from
    the step `chosen` picks; `lines`: each run's metrics by step (runs.read_run); `part`: the
    first logged step where the logs differ, or None; `made`: runs.py's (make_task, side), which
    build a run's task and a segment's live side (passed in: runs.py imports this module)."""
    if tolerance not in (None, 'model', 'bitwise'):
        given = '--x64' if tolerance == 'x64' else f'--tolerance={tolerance}'
        raise UsageError(
            f'{given}: a recorded run saved its steps, not its gradients, in its own precision: '
            'they are judged under the error model (--tolerance=model, the default) or '
            '--tolerance=bitwise'
        )
    rec, live = which_side, 1 - which_side
    start, n = chosen(runs_given[rec], LABELS[rec], runs_given, begin, part, steps)
    report, runner, task, probed, apply = prepared(runs_given, saved, rec, start, tolerance, made)
    report.notes.insert(0, (
        f'{LABELS[rec]}\'s step{"s" * (n > 1)} {start} -> {start + n} read from its checkpoints '
        f'{start}..{start + n}; {LABELS[live]} ran each step here from {LABELS[rec]}\'s state '
        'before it, on the batch the run took'
    ))  # fmt: skip
    for i in range(start, start + n):
        _, _, state = checkpoint.read_numpy(runs_given[rec], i)
        _, _, after = checkpoint.read_numpy(runs_given[rec], i + 1)
        batch, logged = task.train_batches.batch(i), logged_loss(lines[rec], i)
        phase, leaves = judge(runner, probed, apply, state, after, batch, report, rec, logged)
        report.steps += 1
        if leaves:
            report.step, report.phase, report.leaves = i, phase, leaves
            report.ratio = leaves[0].ratio
            report.hints = [
                f'{LABELS[rec]}\'s loss of step {i} is the train_loss its metrics.jsonl logged '
                f'at step {i + 1}; {LABELS[live]}\'s was computed here from {LABELS[rec]}\'s '
                f'state {i} on the same batch'
                if phase == 'forward' else
                f'{LABELS[rec]}\'s step {i} -> {i + 1} is read from its checkpoints {i} and '
                f'{i + 1}; {LABELS[live]} ran step {i} here from {LABELS[rec]}\'s state {i}: '
                f'"A vs B" is the two steps, "{LABELS[live]}:" the live step against the shared '
                'optimizer applied to its own gradient'
            ]  # fmt: skip
            break
    return report


def prepared(runs_given, saved, rec, start, tolerance, made):
    """(the empty report, the live side's Runner, the task, the probes' graphdef, the shared
    optimizer's update) of the recorded side `rec` from checkpoint `start`: each side's name
    says where it ran, and the recorded one the precision it is judged at."""
    make_task, side = made
    live = 1 - rec
    segs = pairing.Stretches(*saved).at(start + 1)
    # the recorded run's schedule (its --steps may differ: the settings are otherwise one)
    config = cfg.TrainConfig(**saved[rec]['train'])
    task = make_task(saved[rec], config)
    live_side = side(segs[live], runs_given[live])
    use_matmul_precision(live_side.plan.precision.matmul)
    policy, said = assumed(segs[rec])
    here = pairing.precision({**segs[live], 'platform': host()})
    where = where_of(segs[rec]) if segs[rec].get('platform') else 'an unrecorded platform'
    names = [None, None]
    names[rec] = f'{runs_given[rec]} ({described(segs[rec])} recorded on {where}, {said})'
    names[live] = live_side.name[:-1] + f' live on {host()})'
    report = D.Report(tuple(names), tolerance or 'model', 0, first=start)
    plans = (segments.plan_of(segs[rec]), live_side.plan)
    devices = max(max(math.prod(p.size(x) for x in p.batch_axes) for p in plans), 1)
    coarsest = numerics.coarsest([policy, here])
    if report.tolerance == 'model':
        report.model = numerics.Budget(*coarsest, devices)
    if report.model and policy != here:
        report.notes.append(
            f'{LABELS[rec]} judged as {policy[0]} compute (tools/compare/pairing.py): the '
            f'gradients\' budgets probed on the model in {coarsest[0]} here'
        )
    declared = (segs[rec].get('precision') or {}).get('compute', 'float32')
    if report.model and pairing.bf16_dots(segs[rec]) and declared == 'float32':
        report.notes.append(
            f'--shadow=float32 cannot re-run a recorded side: for float32\'s detection limits '
            f'train {LABELS[rec]} again with --matmul_precision=highest'
        )
    tx = make_optimizer(config)
    _, graphdef, _ = checkpoint.read_numpy(runs_given[rec], start)
    runner = Runner(live_side, graphdef, task.loss_fn, tx, LABELS[live])
    probed = probe_graphdef(saved[rec], coarsest[0])
    return report, runner, task, probed, D.shared_update(tx)


def described(segment: dict) -> str:
    plan = segments.plan_of(segment)
    return f"{segment.get('twin', '?')} {plan.strategy} {plan.text()}"


def probe_graphdef(saved: dict, compute: str):
    """The graphdef the probes run: the run's model computing in `compute` (the coarser side's
    arithmetic: a TPU's float32 dot at default precision is one bfloat16 pass)."""
    shape = dict(saved['model_config'], dtype=compute)
    return abstract_state({**saved, 'model_config': shape})[0]


def logged_loss(lines: dict, step: int) -> float | None:
    """The recorded run's train_loss of `step` (the loss of the step that made it, at the state
    before it), where its metrics.jsonl has a train line at step + 1 over that step alone
    (--log_every=1, or a line right after another); None otherwise."""
    since = pairing.window_starts(lines[s] for s in sorted(lines))
    line = lines.get(step + 1, {})
    return line.get('train_loss') if since.get(step + 1) == step else None


def judge(runner, probed, apply, state, after, batch, report, rec, logged=None):
    """(phase, the leaves that differ) of one step, (None, []) where none does: the loss the
    recorded run logged for it (`logged`, if any) against the live side's, then the live step
    from `state` against the recorded `after`, and against the shared optimizer applied to the
    live side's own gradient."""
    new = runner.train_step(state, batch)[0]
    sides = (after, new) if rec == 0 else (new, after)
    metrics, grads = runner.loss_and_grads(state, batch)
    loss = float(np.asarray(metrics['loss']))
    losses = (logged, loss) if rec == 0 else (loss, logged)
    if report.tolerance == 'bitwise':
        leaf = logged is not None and compare('loss', *losses, 'bitwise')
        if leaf:
            return 'forward', [leaf]
        return 'update', compare_trees('A vs B: ', *sides, 'bitwise', dtypes=True)
    budget, model, spread = step_budget(runner, probed, apply, state, batch, grads, report)
    report.limits = {}
    if logged is not None:  # the metric's budget as the bisector's loss phase sets it, with
        # what rounding the parameters to the compute dtype moves (budgets.cast): a TPU's
        # float32 dot at default rounds its operands to bfloat16, the CPU's does not
        size = max(abs(loss), abs(logged))
        cast = budgets.cast(grads, state.params, model.compute) / size if size else 0.0
        # the probes jittered every site: the loss's own noise, else its sensitivity (one pass)
        sensitivity = 0.0 if spread or not size else runner.sensitivity(state, batch)['loss'] / size
        allowed = budgets.loss(model, sensitivity, cast, spread, jittered=True)
        report.limits['loss'] = {'loss': allowed}
        report.compared['loss'] = 1
        leaf = compare('loss', *losses, 'model', budget=allowed, seen=Seen(report, 'loss'))
        if leaf:
            return 'forward', [leaf]
    seen, limits = Seen(report, 'update'), {}
    label = runner.label
    leaves = budgets.compare_steps(f'{label}: ', apply(state, grads), new, state, budget, seen)
    leaves += budgets.compare_steps('A vs B: ', *sides, state, budget, seen, limits)
    report.limits['update'] = limits
    report.compared['update'] = 2 * len(jax.tree.leaves(new))
    return 'update', leaves


def step_budget(runner, probed, apply, state, batch, grads, report):
    """(budgets.update's budget of each leaf's step at `state`, the error model at this step,
    the probes' spread of the loss): the gradients' budgets from the live side's probes at the
    model's compute dtype (`probed`), every site jittered, floored at the error model's flat
    budget; the elements' spreads, with a narrow reduce's rounding (which a one-device probe
    cannot see) added as that share of each element."""
    model = dataclasses.replace(
        report.model, modules=runner.modules(state, batch),
        terms=min(np.size(x) for x in jax.tree.leaves(batch)),
        contraction=numerics.widest(state.params),
    )  # fmt: skip
    named = named_leaves(grads)
    reduce = max(model.gradients() - dataclasses.replace(model, reduce='float32').gradients(), 0)
    measured = probes.measured_or_noted(report, 'the probes could not run the live step', probed,
                                        runner.loss_fn, state.params, batch)  # fmt: skip
    if measured is None:
        spread, found, clip = {}, [model.gradients()] * len(named), None
        elements = [model.gradients() * np.abs(np.asarray(g, np.float64)) for _, g in named]
    else:
        spread, noise, elements, norm = measured
        found = budgets.gradients(model, noise, flat=True)
        clip = budgets.gradients(model, [norm], flat=True)[0]  # the global norm's, as a leaf's
        elements = [budgets.C_EST * e for e in elements]
    sigmas = [e + reduce * np.abs(np.asarray(g, np.float64)) for e, (_, g) in zip(elements, named)]
    limits = dict(zip([p for p, _ in named], found))
    budget = budgets.update(
        model,
        limits,
        lambda: numerics.spread(lambda g: apply(state, g).params, grads, None, sigmas=sigmas),
        dict(named),
        clip,
    )
    probed_loss = spread.get('loss', 0.0)
    return budget, model, probed_loss if math.isfinite(probed_loss) else 0.0
