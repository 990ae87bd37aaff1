"""Claim: the four accumulation mistakes of the bug zoo (tools/zoo/accum_*.py) are each found
where they are: by the bisector at the step and phase they first change, against the one-device
run at the full batch, or (a gradient reduced inside the loop: equal values, one all-reduce per
microbatch) by the inspector's `accumulates_in_loop` surprise, which the correct file does not
raise. docs/accumulation.md."""

import dataclasses
import json
import subprocess
import sys

import pytest

from parity_tests.helpers import fresh_state, make_case, plan_of, strategy_mesh
from shard_parity.datasets.batches import partial_window
from shard_parity.step import Accumulated
from shard_parity.tools.bisect import divergence as D


@dataclasses.dataclass
class LastPartial:
    """`batches` whose step `last` is a partial window: `present` of K microbatches."""

    batches: object
    k: int
    present: int
    last: int

    def batch(self, step):
        batch = self.batches.batch(step)
        return partial_window(batch, self.k, self.present) if step == self.last else batch


def bisect(bug, case, k, steps, batches=None):
    graphdef, tx, state = fresh_state(0, case)
    mesh = strategy_mesh('dp', (8, 1))
    sides = [D.load_side(n, plan_of(mesh, 'dp'), mesh) for n in ('one_device', bug)]
    loss_fn = Accumulated(case.loss_fn, k)
    return D.bisect(*sides, graphdef, loss_fn, tx, state, batches or case.batches, steps)


def documents():
    case = make_case('transformer')
    case.batches.documents, case.batches.batch_size = True, 32  # 4 rows a device: K=4 splits
    return case


@pytest.mark.slow
def test_the_correct_file_agrees_on_documents_and_a_partial_window():
    """explicit/dp.py itself, K=4: full windows of documents, then a partial one."""
    case = documents()
    report = bisect('explicit', case, 4, 2, LastPartial(case.batches, 4, 3, last=1))
    assert not report.diverged and report.steps == 2


@pytest.mark.slow
def test_a_loss_averaged_per_microbatch_is_caught_on_a_full_window():
    """The loss itself moves first: the bisector's forward phase, its loss metric (no layer)."""
    report = bisect('tools.zoo.accum_per_microbatch_mean', documents(), 2, 2)
    assert (report.diverged, report.step, report.phase, report.layer) == (True, 0, 'forward', None)
    assert report.leaves[0].path.endswith('loss'), report.leaves


@pytest.mark.slow
def test_a_partial_window_weighted_by_k_is_caught_at_its_step():
    case = make_case('mlp')
    batches = LastPartial(case.batches, 4, 3, last=1)
    report = bisect('tools.zoo.accum_partial_by_k', case, 4, 2, batches)
    assert (report.diverged, report.step, report.phase, report.layer) == (True, 1, 'forward', None)
    assert {leaf.path for leaf in report.leaves} == {'loss', 'accuracy'}, report.leaves
    for leaf in report.leaves:  # 3 of 4 microbatches' worth of each
        assert leaf.ratio == pytest.approx(0.75, rel=1e-5)


@pytest.mark.slow
def test_the_last_microbatch_carried_into_the_next_step_is_caught_at_the_second():
    report = bisect('tools.zoo.accum_carried_over', make_case('mlp'), 2, 3)
    assert (report.diverged, report.step, report.phase) == (True, 1, 'gradients')


@pytest.mark.slow
def test_a_gradient_reduced_inside_the_loop_has_the_same_values():
    """The bisector agrees: the mistake costs K - 1 all-reduces, not a value (the inspector's
    test below names it)."""
    report = bisect('tools.zoo.accum_reduced_in_loop', make_case('mlp'), 4, 1)
    assert not report.diverged


def surprise_kinds(name, k=4):
    """The inspector's surprises in the train step of strategy module `name` (dp, 8 devices)."""
    from shard_parity import inspector
    from shard_parity.placement import place_batch, place_state

    case = make_case('mlp')
    graphdef, tx, state = fresh_state(0, case)
    mesh = strategy_mesh('dp', (8, 1))
    side = D.load_side(name, plan_of(mesh, 'dp'), mesh)
    step = side.module.train_step(graphdef, Accumulated(case.loss_fn, k), tx, side.mesh, side.plan)
    args = (
        place_state(state, mesh, side.plan),
        place_batch(case.batches.batch(0), mesh, side.plan),
    )
    report = inspector.inspect(step, *args).json()
    return [s['kind'] for s in report['surprises']['program']]


def test_the_inspector_names_a_gradient_reduced_inside_the_loop():
    """accumulates_in_loop: the zoo's per-microbatch pmean is flagged, explicit/dp.py's one
    pmean after the loop is not."""
    assert 'reduction-per-iteration' in surprise_kinds('tools.zoo.accum_reduced_in_loop')
    assert 'reduction-per-iteration' not in surprise_kinds('explicit')


@pytest.mark.slow
@pytest.mark.parametrize('target', [None, 'tpu-v5e-8'])
def test_where_each_twin_reduces_per_backend(target):
    """`python -m inspector --gradient_accumulation_steps=4` (MLP, dp on 8): explicit/ all-
    reduces the gradient once, after the loop, on either backend. XLA:CPU's partitioner puts
    auto/'s inside the loop, once per microbatch, and the inspector says so (reduction-per-
    iteration); for a TPU (--target=tpu-v5e-8) XLA moves it out: once, only the loss's scalar
    per microbatch. typed/'s unreduced weights' gradients are added once on both; on CPU its
    biases' (summed over the rows, never `reduced`) go per microbatch, flagged."""
    from parity_tests.helpers import REPO

    flags = ['--model=mlp', '--strategy=dp', '--batch_size=64', '--json']
    flags += ['--gradient_accumulation_steps=4']
    flags += [f'--target={target}'] if target else ['--cpu_devices=8']
    out = subprocess.run([sys.executable, '-m', 'inspector', *flags], cwd=REPO,
                         capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    grads = {  # the trips of each all-reduce carrying over a megabyte (the gradient)
        twin: sorted(
            op['trip_count']
            for op in report['programs'][twin]
            if op['kind'] == 'all-reduce' and op['bytes'] > 1 << 20
        )
        for twin in ('auto', 'explicit', 'typed')
    }
    flagged = {
        twin: 'reduction-per-iteration' in [s['kind'] for s in report['surprises'][twin]]
        for twin in ('auto', 'explicit', 'typed')
    }
    assert grads['explicit'] == [1] and grads['typed'] == [1] and not flagged['explicit']
    if target is None:
        assert grads['auto'] == [1, 3] and flagged['auto'] and flagged['typed']
    else:
        assert grads['auto'] == [1] and not flagged['auto'] and not flagged['typed']
