"""The fuzzer's worker (python -m tools.fuzz starts one per device count): runs draws, one per
line of stdin, each a JSON object {"flags": [...], "twins": [...]}, and answers each with one
line `FUZZ {...}` on stdout (all else it prints goes to stderr). A job with "steps": 2 compares
two steps, the second from one device's state after the first (the bisector's walk), and with
"partial": P that second step is a partial window of P of K microbatches (the bisector's
--partial_window). A job with "checkpoint": a
mesh also saves each twin that agrees after 3 steps and restores it there
(tools/fuzz/checkpoint.py); one with "trained": N compares step N, from one device's state
after N steps (the bisector's --steps=N+1 walk); one with "target": a TPU slice compiles each
twin's step for it and checks its collectives, running nothing (tools/fuzz/target.py).

A draw starts as the bisector's run does (tools/bisect/cli.py, `started`: the train CLI's plan and
checks, the task, the initial state), so that its command replays it: a refusal is the CLI's
line; else each twin takes one step beside one device (tools/bisect/stepping.py's compare_step: the
activations, the loss and every gradient, then the update) at the bisector's tolerance for the
pair (new_report: f32 round-off, or the error model of docs/numerics.md where either side
computes or reduces in bfloat16), one-device programs compiled once for all the twins. A hang or a crash here is the driver's to see: it kills and restarts this.

    python -m tools.fuzz.worker 8 < jobs.jsonl
"""

import json
import os
import sys
import time
import traceback

import jax
from absl import flags, logging

from shard_parity import UsageError

from ..bisect import cli as bisect
from ..bisect import divergence as D
from . import target as fuzz_target
from .checkpoint import round_trip
from ..bisect.sides import SideFailed, load_side, where


def run(job: dict) -> dict:
    """One draw: {'status': 'refused', 'message'} or {'status': 'ran', 'twins': {twin:
    {'verdict': 'agrees'|'diverges'|'fails'|'refused', 'message'}}}."""
    flags.FLAGS.unparse_flags()
    try:
        flags.FLAGS(['fuzz', *job['flags'], '--steps=1'])
        start = bisect.started()
    except (UsageError, flags.Error) as e:
        return {'status': 'refused', 'message': str(e)}
    one = D.Runner(load_side('one_device', start.plan, None), start.graphdef, start.loss_fn,
                   start.tx, 'A')  # fmt: skip
    apply = D.shared_update(start.tx)
    if job.get('target'):  # compiled for a TPU slice, held to the plan's axes: nothing runs
        return {
            'status': 'ran',
            'twins': {t: compiled(t, start, job['target']) for t in job['twins']},
        }
    state, step = trained(one, start, job.get('trained', 0))
    try:
        batches, verdicts = compared(start, step, job.get('steps', 1), job.get('partial', 0)), {}
    except UsageError as e:  # a partial window that is none (the bisector's --partial_window)
        return {'status': 'refused', 'message': str(e)}
    for twin in job['twins']:
        verdicts[twin] = one_twin(twin, start, one, apply, batches, job.get('checkpoint'),
                                  state, step)  # fmt: skip
    return {'status': 'ran', 'twins': verdicts}


def compared(start, step: int, steps: int, partial: int) -> list:
    """The batches of the `steps` steps compared from `step`, the last a partial window of
    `partial` of K microbatches where `partial` (as the bisector's --partial_window makes it)."""
    window = bisect.window(start, step + steps - 1, partial) if partial else None
    batches = bisect.Batches(start.task, window)
    return [batches.batch(step + i) for i in range(steps)]


def trained(one, start, steps: int):
    """(the state after `steps` steps of one device from the seed's, on batches 0..steps-1, as
    the bisector walks them with --steps=steps+1; the step compared next)."""
    state = start.state
    for i in range(steps):
        state, _ = one.train_step(state, start.batches.batch(i))
    return state, steps


def one_twin(twin: str, start, one, apply, batches, checkpoint: str | None = None, state=None,
             step: int = 0) -> dict:  # fmt: skip
    """{'verdict', 'message', 'tolerance'}: `twin`'s steps beside one device's (`one`, its
    Runner), at the bisector's tolerance for the pair ('f32' or 'model'), from `state` (default
    the seed's) at `step`, one per batch of `batches`, each from one device's state after the
    one before, as the bisector walks them (the twin's compiled step kept: what it carries
    from one step into the next is seen)."""
    state = start.state if state is None else state
    try:
        side = load_side(twin, start.plan, start.mesh)
        runner = D.Runner(side, start.graphdef, start.loss_fn, start.tx, 'B')
        report = D.new_report(one.side, side)  # the bisector's: bf16's error model, or f32's
        for i, batch in enumerate(batches):
            phase, layer, out = D.compare_step(
                one, runner, apply, state, batch, report.tolerance, report, step + i
            )
            report.steps += 1
            if phase:
                step += i
                break
            state = out
    except UsageError as e:
        return {'verdict': 'refused', 'message': str(e)}
    except SideFailed as e:
        return {'verdict': 'fails', 'message': str(e)}
    except Exception as e:  # the one-device side, or the comparison itself
        return {'verdict': 'fails', 'message': raised(e)}
    if phase is None and checkpoint:  # a twin that agrees: then its checkpoint's round trip
        try:
            wrong = round_trip(runner, start, checkpoint)
        except Exception as e:
            wrong = f'checkpoint restored on {checkpoint}: {raised(e)}'
        if wrong:
            return {'verdict': 'checkpoint', 'message': wrong, 'tolerance': report.tolerance}
    if phase is None:
        return {'verdict': 'agrees', 'message': '', 'tolerance': report.tolerance}
    D._diverged(report, step, phase, layer, out, one.side, side)
    return {'verdict': 'diverges', 'message': bisect.render(report), 'tolerance': report.tolerance}


def compiled(twin: str, start, target: str) -> dict:
    """{'verdict': 'agrees'|'collectives'|'fails'|'refused', 'message'}: `twin`'s train step
    compiled for `target` and held to the plan's axes (tools/fuzz/target.py)."""
    try:
        side = load_side(twin, start.plan, start.mesh)
    except UsageError as e:
        return {'verdict': 'refused', 'message': str(e)}
    except SideFailed as e:
        return {'verdict': 'fails', 'message': str(e)}
    try:
        wrong = fuzz_target.check(side, start, target)
    except UsageError as e:
        return {'verdict': 'refused', 'message': str(e)}
    except Exception as e:  # as the bisector says a side that cannot trace (sides.guarded)
        first = (str(e).strip().splitlines() or [''])[0][:200]
        at = f'B ({twin}) fails to compile for {target} at {where(e, side)}'
        return {'verdict': 'fails', 'message': f'{at}: {type(e).__name__}: {first}'}
    return {'verdict': 'collectives' if wrong else 'agrees', 'message': wrong or ''}


def raised(e: Exception) -> str:
    """'file:line: Type: first line' of an exception, where it was raised."""
    last = traceback.extract_tb(e.__traceback__)[-1]
    first = (str(e).strip().splitlines() or [''])[0][:200]
    return f'{os.path.relpath(last.filename)}:{last.lineno}: {type(e).__name__}: {first}'


def main() -> None:
    devices = int(sys.argv[1])
    answers = os.fdopen(os.dup(1), 'w')
    os.dup2(2, 1)  # what the draws print (warnings, notes) goes to stderr
    from shard_parity.devices import configure_jax

    configure_jax(devices)  # before anything starts JAX's backend
    logging.set_verbosity(logging.WARNING)

    for line in sys.stdin:
        t0 = time.monotonic()
        result = run(json.loads(line))
        jax.clear_caches()  # each draw's programs are its own: memory stays flat
        result['seconds'] = round(time.monotonic() - t0, 2)
        answers.write('FUZZ ' + json.dumps(result) + '\n')
        answers.flush()


if __name__ == '__main__':
    main()
