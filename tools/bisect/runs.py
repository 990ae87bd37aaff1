"""The bisector on two train runs' workdirs: `python -m tools.bisect RUN_A RUN_B`.

Finds the first logged step where the two metrics.jsonl differ (train_loss, train_grad_norm
with --log_grad_norm, the eval figures), restores the newest checkpoint both runs have before
it (or the one --from=RUN@STEP names), each with its own twin, strategy and mesh from its
config.json, and replays step by step from there (tools/bisect/divergence.py). A step-0
checkpoint (train with --save_initial) lets it start from the beginning. A run that trained on
another platform (a TPU chip beside this CPU), or the one --recorded names, is not replayed:
tools/bisect/recorded.py.
"""

import json
import pathlib
import sys

from shard_parity import UsageError, numerics
from shard_parity.mesh import mesh_for
from shard_parity.runtime import checkpoint, segments, tasks
from shard_parity.runtime.saved import DEFAULTS, RESUMABLE
from shard_parity import config as cfg
from shard_parity.step import make_optimizer

from . import divergence as D
from . import leaves, trained
from ..compare import pairing
from .sides import Side, load_side

SAME = ('model', 'model_config', 'train')  # what two runs must share to be replayed together


class Unreplayable(UsageError):
    """The runs differ, but share no checkpoint to replay them from: the answer is that they
    disagree (exit 1, with the step where their logs part), not a refused input."""

    exit_code = 1


def read_run(workdir: str) -> tuple[dict, dict]:
    """(config.json, {step: merged metrics of that step}) of a workdir. Torn or garbled metrics
    lines are skipped with one warning; a config.json that cannot be read is a UsageError."""
    root = pathlib.Path(workdir)
    for name in ('config.json', 'metrics.jsonl'):
        if (root / name).is_dir():
            raise UsageError(f'{root / name} is a folder, not the file a train run writes')
    if not (root / 'config.json').is_file() or not (root / 'metrics.jsonl').is_file():
        raise UsageError(f'{workdir} has no config.json and metrics.jsonl: not a train workdir')
    lines, skipped = {}, 0
    text = (root / 'metrics.jsonl').read_bytes().decode('utf-8', errors='replace')
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not usable(record):
            skipped += bool(line.strip())
        elif not record.get('final'):
            lines.setdefault(int(record['step']), {}).update(record)
    if skipped:
        print(
            f'warning: skipped {skipped} torn or garbled line(s) of {root / "metrics.jsonl"}',
            file=sys.stderr,
        )
    return read_config(root / 'config.json'), lines


def usable(record) -> bool:
    """A metrics line as the loop writes it: an integer step and numbers."""
    numbers = (int, float)
    return (
        isinstance(record, dict)
        and isinstance(record.get('step'), int)
        and all(isinstance(v, numbers) for k, v in record.items() if k not in ('step', 'final'))
    )


def read_config(path: pathlib.Path) -> dict:
    try:
        saved = json.loads(path.read_bytes().decode('utf-8', errors='replace'))
        for key, kind in (('model', str), ('model_config', dict), ('train', dict)):
            if not isinstance(saved.get(key), kind):
                raise ValueError(f'no {key}')
        return saved
    except ValueError as e:
        raise UsageError(f'{path} is not a readable config.json ({str(e)[:100]})') from e


def different_settings(a: dict, b: dict) -> list[str]:
    diffs = [f"--model: A {a['model']}, B {b['model']}"] if a['model'] != b['model'] else []
    for group in SAME[1:]:
        for key in sorted(set(a[group]) | set(b[group])):
            x, y = (r[group].get(key, DEFAULTS[group].get(key)) for r in (a, b))
            if key not in RESUMABLE and x != y:  # a field one lacks: its default
                diffs.append(f'--{key}: A {x}, B {y}')
    return diffs


def first_difference(lines_a: dict, lines_b: dict, tolerance: str, policy=None):
    """(first logged step whose shared figures differ, or None; the last step that agreed; the
    steps whose train figures were not compared). A train figure is compared only with one
    averaged over the same steps (tools/compare/pairing.py)."""
    agreed, skipped = 0, []
    since = [pairing.window_starts(lines[s] for s in sorted(lines)) for lines in (lines_a, lines_b)]
    for step in sorted(set(lines_a) & set(lines_b)):
        keys = sorted((set(lines_a[step]) & set(lines_b[step])) - {'step', pairing.AVERAGED})
        if since[0].get(step) != since[1].get(step):  # means over different steps: like is
            keys = [k for k in keys if not k.startswith('train_')]  # paired with like only
            skipped += [step] * (step in since[0] and step in since[1])
        for key in keys:
            band = policy and numerics.band(*policy, step)  # --tolerance=model: the band
            if leaves.compare(key, [lines_a[step][key]], [lines_b[step][key]], tolerance, 1, band):
                return step, agreed, skipped
        agreed = step
    return None, agreed, skipped


def bisect_runs(run_a: str, run_b: str, tolerance: str, widen, steps: int | None,
                begin: str | None = None, recorded: str | None = None):  # fmt: skip
    """`begin`: --from=RUN@STEP, the checkpoint both runs hold that the replay starts from
    (default: the newest one before their logs part). A run that trained on another platform
    than this host, or the one `recorded` (--recorded=A|B) names, is not replayed: its steps
    are read from its checkpoints (tools/bisect/recorded.py)."""
    from . import recorded as R

    if pathlib.Path(run_a).resolve() == pathlib.Path(run_b).resolve():
        raise UsageError(f'{run_a} and {run_b} are the same directory: give two different runs')
    (saved_a, lines_a), (saved_b, lines_b) = read_run(run_a), read_run(run_b)
    check_same_settings(run_a, run_b, saved_a, saved_b)
    which, away = R.which(saved_a, saved_b, recorded)
    given = tolerance
    # the coarsest policy of any segment (a run back in float32 after bf16 keeps its rounding)
    policy = pairing.Stretches(saved_a, saved_b).policy()
    if tolerance is None:  # the error model where either run is not float32 throughout
        tolerance = 'model' if numerics.coarser(*policy) != 'float32' else 'f32'
    policy = policy if tolerance == 'model' else None
    step, agreed, skipped = first_difference(lines_a, lines_b, tolerance, policy)
    if which is not None:  # one side's steps from its checkpoints, the other's live here
        runs, saved, lines = (run_a, run_b), (saved_a, saved_b), (lines_a, lines_b)
        return R.bisect(runs, saved, lines, step, which, given, steps, begin, (make_task, side))
    if step is None and not begin:
        report = D.Report((run_a, run_b), tolerance, 0, identical=identical(lines_a, lines_b))
        if policy:
            report.model = numerics.Budget(*policy)
        report.notes = window_notes(skipped) + segment_notes(pairing.Stretches(saved_a, saved_b))
        report.notes += away
        return report
    common = sorted(set(checkpoint.steps(run_a)) & set(checkpoint.steps(run_b)))
    if begin:
        start = chosen_start(begin, run_a, run_b, common)
    else:
        before = [s for s in common if s <= agreed] or [s for s in common if s < step]
        if not before:
            raise Unreplayable(
                f'the runs first differ at logged step {step}, but they share no checkpoint '
                f'before it (A: {checkpoint.steps(run_a) or "none"}, B: '
                f'{checkpoint.steps(run_b) or "none"}): train with --save_initial (a step-0 '
                'checkpoint) and a smaller --checkpoint_every'
            )
        start = before[-1]
    # with --from, logs that never part are replayed still: to their last shared line
    last = max(set(lines_a) & set(lines_b), default=start)
    part = step if step is not None and step > start else max(last, start + 1)
    _, graphdef, state_a = checkpoint.read_numpy(run_a, start)
    _, _, state_b = checkpoint.read_numpy(run_b, start)
    config = cfg.TrainConfig(**saved_a['train'])
    x64 = tolerance == 'x64'
    parts = pairing.Stretches(saved_a, saved_b)  # each side: the segment of the first difference
    sides = [side(seg, run, x64) for seg, run in zip(parts.at(part), (run_a, run_b))]
    task = make_task(saved_a, config, x64)
    report = D.bisect(
        *sides,
        graphdef,
        task.loss_fn,
        make_optimizer(config),
        widen(state_a),
        _Widened(task, widen),
        steps or part - start,
        tolerance,
        start=start,
        state_b=widen(state_b),
    )
    said = segment_notes(parts, start, step) if step is not None else segment_notes(parts)
    report.notes = window_notes(skipped) + said + away
    if begin:
        agree = '' if step is not None else 'their logs agree at every step both logged; '
        report.notes.insert(0, f'{agree}replayed from checkpoint {start}, as --from={begin} asks')
    return report


def chosen_start(begin: str, run_a: str, run_b: str, common: list[int]) -> int:
    """The step of --from=RUN@STEP (RUN: either run, or nothing before the @), which both runs
    must have saved; refused in one line otherwise."""
    workdir, step = trained.parse(begin)
    runs = {pathlib.Path(r).resolve() for r in (run_a, run_b)}
    if workdir and pathlib.Path(workdir).resolve() not in runs:
        raise UsageError(
            f'--from={begin}: with two run directories --from picks the checkpoint both hold to '
            f'replay from: give --from={run_a}@STEP, STEP one of {common or "none"}'
        )
    if step is None:
        raise UsageError(
            f'--from={begin}: with two run directories the replay starts from the newest '
            f'checkpoint both hold before their logs part; --from={run_a}@STEP picks another '
            f'of those both hold: {common or "none"}'
        )
    if step not in common:
        raise UsageError(
            f'--from={begin}: step {step} was not saved by both runs; saved steps both hold: '
            f'{common or "none"}'
        )
    return step


def check_same_settings(run_a: str, run_b: str, saved_a: dict, saved_b: dict) -> None:
    """Refuses runs of other settings in one line, with what to run instead."""
    diffs = different_settings(saved_a, saved_b)
    if diffs:
        raise UsageError(
            f'{run_a} and {run_b} were trained with other settings: {"; ".join(diffs)}. The '
            'bisector replays runs of one experiment; see how far apart they are with python -m '
            f'tools.compare {run_a} {run_b} --allow_other_settings, or bisect their twins under '
            f"B's settings: {instead(saved_a, saved_b)}"
        )


def identical(lines_a: dict, lines_b: dict) -> bool:
    """Whether every figure both runs logged at a step both logged is the same number (a train
    mean over other steps included: runs bitwise identical log the same lines)."""
    shared = [(s, k) for s in set(lines_a) & set(lines_b)
              for k in (set(lines_a[s]) & set(lines_b[s])) - {'step'}]  # fmt: skip
    return bool(shared) and all(lines_a[s][k] == lines_b[s][k] for s, k in shared)


def instead(a: dict, b: dict) -> str:
    """The bisect command that compares the two runs' twins (their last segments) on B's mesh
    and with B's settings where they differ from A's."""
    last = [(segments.of(s) or [s])[-1] for s in (a, b)]
    twins = [seg.get('twin') or '?' for seg in last]
    if twins[0] == twins[1]:
        twins[0] = 'one_device'  # one twin against itself says nothing: against one device
    words = ['python -m tools.bisect', f'--twins={",".join(twins)}', f"--model={b['model']}"]
    try:
        words.append(f'--mesh={segments.plan_of(last[1]).text()}')
    except UsageError:
        pass
    for group in SAME[1:]:
        for key in sorted(b[group]):
            value = b[group][key]
            if key not in RESUMABLE and a[group].get(key, DEFAULTS[group].get(key)) != value:
                value = ','.join(map(str, value)) if isinstance(value, (list, tuple)) else value
                words.append(f'--{key}={value}')
    return ' '.join(words)


def window_notes(skipped: list[int]) -> list[str]:
    if not skipped:
        return []
    return [
        f'{len(skipped)} train line(s) of the two runs average over different steps (another '
        '--log_every, or the first line after resuming a checkpoint that kept no averaging '
        f'window: train_steps_averaged), first at step {skipped[0]}: not compared'
    ]


def segment_notes(parts: pairing.Stretches, start: int = 0, step: int | None = None) -> list:
    """What the replay pairs, for runs that moved meshes: each run's segments, the stretch of the
    first differing step, and whether the replay from `start` crosses into it from another."""
    if not parts.moved:
        return []
    runs = zip('AB', (parts.lines(0), parts.lines(1)), parts.saved)
    notes = [f'{label} {pairing.changed(saved)}: ' + '; '.join(lines)
             for label, lines, saved in runs if lines]  # fmt: skip
    if step is None:
        return notes + [f'{parts.span(i)}: {parts.plans(i)}' for i in range(len(parts.starts))]
    i = parts.index(step)
    notes.append(f'the first differing step, {step}, is in {parts.span(i)}: {parts.plans(i)}')
    if parts.index(start + 1) != i:
        notes.append(
            f'the replay from checkpoint {start} crosses into that stretch from '
            f'{parts.span(parts.index(start + 1))} ({parts.plans(parts.index(start + 1))}); '
            'both sides replay every step with the plans of the first differing step'
        )
    return notes


def side(segment: dict, run: str, x64: bool = False) -> Side:
    """A run's side: the twin and plan of `segment` (shard_parity/runtime/segments.py; a
    config.json written before segments is one), its options and precision included."""
    plan = segments.plan_of(segment)  # runs before named meshes too
    plan = plan.in_float64() if x64 else plan
    found = load_side(segment['twin'], plan, mesh_for(plan))
    return found._replace(name=f"{run} ({segment['twin']} {plan.strategy} {plan.text()})")


def make_task(saved: dict, config, x64: bool = False):
    """The run's task, its model as config.json built it (a run saved before the MLP took
    --dtype: float32); under --x64 in float64 throughout."""
    wide = {'dtype': 'float64', 'reduce_dtype': 'float64'} if x64 else {}
    shape = dict(saved['model_config'], **wide)
    if saved['model'] == 'mlp':
        shape['layer_sizes'] = tuple(shape.get('layer_sizes', cfg.MLPConfig().layer_sizes))
        return tasks.mnist_task(config, model_config=cfg.MLPConfig(**shape))
    return tasks.shakespeare_task(config, cfg.TransformerConfig(**shape))


class _Widened:
    def __init__(self, task, widen):
        self.task, self.widen = task, widen

    def batch(self, i):
        return self.widen(self.task.train_batches.batch(i))
