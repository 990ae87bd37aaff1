"""Claim (issue 52, items 2-5): the bisector's bf16 verdicts hold on trained states. Each
gradient leaf's budget comes from its own rounding noise, measured on side A's step at that
state (tools/bisect/probes.py), so correct twins raise no false alarm once the model has
trained; the update is judged as the step it makes, so a 1% change of a warm-up step is seen in
float32; and every "agree" states its detection limits, each of which is what the comparison
sees: a change of twice the limit planted in one leaf is caught, half of it is not."""

import jax
import numpy as np
import optax
import pytest

from benchmarks import numerics as calibration
from parity_tests import planted_leaf
from tools.bisect import budgets, probes, stepping
from tools.bisect.leaves import compare

COMPOSED = (('data', 2), ('fsdp', 2), ('model', 2))
DP8 = calibration.DP8
NO_WARMUP = {'warmup_steps': 0}
TRAINED = 1000  # steps of one device's training before the states the slow tests judge


def test_a_one_percent_change_of_a_warm_up_step_is_caught_as_the_step():
    """A LayerNorm scale near 1 that a warm-up step moves by 1e-5 (AdamW's first steps: the
    learning rate, sign-like): as the parameter, a 1% larger step is 1e-7 of it, inside float32's
    tolerance; as the step, it is 1% of it, and caught. Two programs' steps that differ by
    float32's own discrepancy (1e-6 of the step) are not."""
    rng = np.random.default_rng(0)
    old = (1 + 0.1 * rng.standard_normal(4096)).astype(np.float32)
    step = 1e-5 * np.sign(rng.standard_normal(4096))
    a, ok, bug = ((old + step * k).astype(np.float32) for k in (1, 1 + 1e-6, 1.01))
    assert compare('w', a, bug, 'f32') is None  # as the state: unseen
    assert not budgets.compare_steps('', {'w': a}, {'w': ok}, {'w': old}, budgets.f32_step)
    caught = budgets.compare_steps('', {'w': a}, {'w': bug}, {'w': old}, budgets.f32_step)
    assert caught and caught[0].budgets >= 3, caught
    assert 0.005 < caught[0].error < 0.03, caught  # 1% of the step, stored to an ulp


def test_the_probes_measure_each_leafs_own_noise_at_the_states_precision():
    """The MLP's gradients jittered at every rounded result: in bf16 each leaf's noise is about
    2^16 times float32's (the unit round-offs), the leaves' noises are their own (not one flat
    fraction), and no probe moves a gradient when switched off."""
    noise = {}
    for compute in ('bfloat16', 'float32'):
        graphdef, loss_fn, _, state, batches, _, _ = calibration.case_inputs(
            'mlp', 'dp', DP8, compute, 'float32', {}
        )
        noise[compute] = probes.measure(graphdef, loss_fn, state.params, batches.batch(0))[1]
    bf16, f32 = np.array(noise['bfloat16']), np.array(noise['float32'])
    print(f'bf16 {bf16}; f32 {f32}')
    assert np.all(bf16 > 0) and np.all(f32 > 0)
    assert 2**12 < np.median(bf16 / f32) < 2**20
    assert bf16.max() > 2 * bf16.min()  # each leaf its own


def test_the_loss_budget_holds_what_a_kept_cast_parameter_moves():
    """One device's bf16 step of the tiny transformer keeps a cast parameter in float32 (XLA's
    excess precision): after AdamW's first steps the parameters are no longer bf16 numbers, and
    its loss at the parameters and at the parameters rounded to bf16 differ (a twin that rounds
    them is that far off, correctly). budgets.cast, A's gradient against what the cast drops,
    is that move to first order; nothing where the compute is float32."""
    import jax
    import jax.numpy as jnp

    from shard_parity.step import one_device_loss_and_grads, one_device_train_step

    graphdef, loss_fn, tx, state, batches, _, _ = calibration.case_inputs(
        'transformer', 'dp', DP8, 'bfloat16', 'float32', {}, {**NO_WARMUP, 'learning_rate': 3e-3}
    )
    step, grads = one_device_train_step(graphdef, loss_fn, tx), one_device_loss_and_grads(
        graphdef, loss_fn)
    for i in range(3):
        state, _ = step(state, batches.batch(i))
    batch = batches.batch(3)
    rounded = jax.tree.map(lambda p: p.astype(jnp.bfloat16).astype(p.dtype), state.params)
    (metrics, g), (other, _) = grads(state.params, batch), grads(rounded, batch)
    loss = float(metrics['loss'])
    moved = abs(loss - float(other['loss'])) / loss
    first_order = budgets.cast(jax.device_get(g), jax.device_get(state.params), 'bfloat16') / loss
    print(f'the loss moves {moved:.3g} where the casts round; first order {first_order:.3g}')
    assert moved > 1e-5  # they differ: far above float32's rounding of the loss
    assert 0.5 < first_order / moved < 2
    assert budgets.cast(jax.device_get(g), jax.device_get(state.params), 'float32') == 0


def test_the_gradient_budget_holds_what_a_kept_cast_parameter_moves():
    """The gradient's counterpart of the loss's cast term: after AdamW's first steps the
    parameters are no longer bf16 numbers, and one device's gradient at them and at them
    rounded to bf16 differ on every leaf by far more than float32's reordering (a correct twin
    that rounds its cast parameters is that far off: budgets.moved, C_CAST x it in the leaf's
    budget where a row's arithmetic may differ); nothing to round where the compute is
    float32."""
    import jax

    from shard_parity.step import one_device_loss_and_grads, one_device_train_step

    graphdef, loss_fn, tx, state, batches, _, _ = calibration.case_inputs(
        'transformer', 'dp', DP8, 'bfloat16', 'float32', {}, {**NO_WARMUP, 'learning_rate': 1e-3}
    )
    step = one_device_train_step(graphdef, loss_fn, tx)
    grads = one_device_loss_and_grads(graphdef, loss_fn)
    for i in range(3):
        state, _ = step(state, batches.batch(i))
    params, batch = jax.device_get(state.params), batches.batch(3)
    assert budgets.rounded(params, 'float32') is None
    cut = budgets.rounded(params, 'bfloat16')
    moves = budgets.moved(jax.device_get(grads(params, batch)[1]),
                          jax.device_get(grads(cut, batch)[1]))  # fmt: skip
    again = budgets.moved(jax.device_get(grads(params, batch)[1]),
                          jax.device_get(grads(params, batch)[1]))  # fmt: skip
    print(f'the gradients move {np.round(moves, 5)} where the parameters are rounded')
    assert min(moves) > 1e-4 and max(again) == 0  # they differ, and only through the rounding


@pytest.mark.slow
@pytest.mark.parametrize('bug', ['update_1pct', 'decay_all'])
def test_update_bugs_are_caught_in_float32_in_the_warm_up(bug):
    """The transformer's default warm-up (100 steps from 0): step 0 moves nothing, step 1 moves
    each parameter by about 1e-5 of itself. Every step 1% too large (update_1pct), or AdamW's
    decay on the LayerNorm scales and biases too (decay_all), is caught at step 1, the update,
    in float32; explicit against itself agrees (the control)."""
    case = ('transformer', 'dp', DP8, 'float32', 'float32', {})
    report = calibration.run('explicit', f'tools.zoo.{bug}', *case, 2, tolerance='f32')
    leaf = report.leaves[0] if report.leaves else None
    print(f'{bug}: step {report.step} {report.phase} {leaf}')
    assert (report.step, report.phase) == (1, 'update'), (report.step, report.phase)
    assert leaf.path.startswith('B: params.') and leaf.budgets > 3, leaf
    control = calibration.run('explicit', 'explicit', *case, 2, tolerance='f32')
    assert not control.diverged, control.leaves


def limit_of(report, phase, leaf):
    path = leaf if phase == 'gradients' else f'params.{leaf}'
    return report.limits[phase][path]


@pytest.mark.slow
@pytest.mark.parametrize('phase', ['gradients', 'update'])
@pytest.mark.parametrize('trained', [0, TRAINED])
def test_each_stated_limit_is_what_the_comparison_sees(phase, trained, monkeypatch):
    """One device against explicit dp on 8 devices, bf16, no warm-up, at step 0 and after
    1,000 steps: the limit stated for a leaf's gradient or step; the same leaf changed by twice
    it in B is caught there (that phase, that leaf), by half of it reads "agree"."""
    monkeypatch.setattr(planted_leaf, 'PHASE', phase)
    case = ('transformer', 'dp', DP8, 'bfloat16', 'float32', {})

    def run(change):
        monkeypatch.setattr(planted_leaf, 'CHANGE', change)
        return calibration.run('one_device', 'parity_tests.planted_leaf', *case, 1,
                               train=NO_WARMUP, trained=trained)  # fmt: skip

    clean = run(0.0)
    assert not clean.diverged, clean.leaves
    limit = limit_of(clean, phase, planted_leaf.LEAF)
    print(f'{phase} at step {trained}: the limit of {planted_leaf.LEAF} is {limit:.3g}')
    caught, unseen = run(2 * limit), run(limit / 2)
    assert caught.diverged and caught.phase == phase, (caught.phase, caught.leaves)
    assert any(planted_leaf.LEAF in leaf.path for leaf in caught.leaves), caught.leaves
    assert not unseen.diverged, unseen.leaves


@pytest.mark.slow
@pytest.mark.parametrize('trained', [0, TRAINED])
def test_the_loss_limit_is_what_the_comparison_sees(trained, monkeypatch):
    """One device against explicit composed (data:2,fsdp:2,model:2), bf16, no warm-up, at step 0
    and after 1,000 steps, where the loss's budget is its own noise under the probes and the
    kept cast's move (budgets.loss): the loss's stated limit; B's loss changed by twice it is
    caught at the loss (phase forward), by half of it reads "agree"."""
    from parity_tests import planted_loss

    def run(change):
        monkeypatch.setattr(planted_loss, 'CHANGE', change)
        return calibration.run('one_device', 'parity_tests.planted_loss', 'transformer',
                               'composed', COMPOSED, 'bfloat16', 'float32', {}, 1,
                               train=NO_WARMUP, trained=trained)  # fmt: skip

    clean = run(0.0)
    assert not clean.diverged, clean.leaves
    limit = clean.limits['loss']['loss']
    print(f'the loss at step {trained}: its limit {limit:.3g}')
    caught, unseen = run(2 * limit), run(limit / 2)
    assert caught.diverged and caught.phase == 'forward', (caught.phase, caught.leaves)
    assert [leaf.path for leaf in caught.leaves] == ['loss'], caught.leaves
    assert not unseen.diverged, unseen.leaves


@pytest.mark.slow
@pytest.mark.parametrize('trained', [0, TRAINED])
def test_measured_error_over_its_estimate_is_within_a_factor_3(trained, monkeypatch):
    """The gradients of one device and explicit composed (data:2,fsdp:2,model:2, bf16, no
    warm-up): each leaf's error between the two sides over its estimate (budgets.C_EST x the
    probes' noise, plus budgets.moved, both from A alone) lies in [0.3, 3] on 90% of the leaves
    or more, at step 0 and after 1,000 steps. So does the global norm that AdamW's clip
    divides by, whose budget the update's leaves carry (budgets.update's `clip`): its error
    over C_EST x its own noise under the probes (probes.Measured.norm) is at most 3, and so is
    the loss's, over C_EST x its noise plus what the parameters rounded to bf16 move it."""
    noises, moves, grads = [], [], []

    def kept(into, fn):
        return lambda *a, **k: into.append(fn(*a, **k)) or into[-1]

    monkeypatch.setattr(probes, 'measure', kept(noises, probes.measure))
    monkeypatch.setattr(budgets, 'moved', kept(moves, budgets.moved))
    real = stepping.Runner.loss_and_grads  # A's, B's, then A's at the rounded parameters
    monkeypatch.setattr(stepping.Runner, 'loss_and_grads', kept(grads, real))
    report = calibration.run('one_device', 'explicit', 'transformer', 'composed', COMPOSED,
                             'bfloat16', 'float32', {}, 1, train=NO_WARMUP, trained=trained)  # fmt: skip
    assert not report.diverged, report.leaves
    limits = report.limits['gradients']
    errors = [f * limits[path] for phase, path, f in report.seen if phase == 'gradients']
    # the estimate: C_EST x the probes' noise, plus what A's gradient moves at the parameters
    # rounded to bf16 (0 at the seed's state, measured)
    cast = moves[0] if moves else [0.0] * len(errors)
    estimates = [budgets.C_EST * n + m for n, m in zip(noises[0][1], cast, strict=True)]
    ratios = [e / x for e, x in zip(errors, estimates, strict=True)]
    inside = np.mean([0.3 <= r <= 3 for r in ratios])
    print(f'step {trained}: measured / estimate {np.round(ratios, 2)}')
    assert len(ratios) == len(limits) and inside >= 0.9, ratios
    norm = [float(optax.tree.norm(g)) for _, g in grads]
    # the norm's estimate, as a leaf's: its noise, plus its move at the rounded parameters
    estimate = budgets.C_EST * noises[0].norm * norm[0] + (abs(norm[2] - norm[0]) if moves else 0)
    print(f'step {trained}: the global norm {norm[0]:.4g}, measured / estimate '
          f'{abs(norm[1] - norm[0]) / estimate:.3g}')  # fmt: skip
    assert 0 < abs(norm[1] - norm[0]) <= 3 * estimate, (norm, estimate)
    # ...and so does the loss, whose budget is its own noise and the kept cast's move
    # (budgets.loss): 0.86 at step 0 and 0.36 after 1,000 steps (2026-12-07, one draw each)
    loss = [float(m['loss']) for m, _ in grads]
    estimate = (budgets.C_EST * noises[0].spread['loss'] * abs(loss[0])
                + (abs(loss[2] - loss[0]) if moves else 0))  # fmt: skip
    print(f'step {trained}: the loss {loss[0]:.5g}, measured / estimate '
          f'{abs(loss[1] - loss[0]) / estimate:.3g}')  # fmt: skip
    assert 0 < abs(loss[1] - loss[0]) <= 3 * estimate, (loss, estimate)


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.parametrize('rate,steps', [(3e-3, 16), (1e-2, 25)])
def test_the_issues_false_alarms_at_higher_rates_are_gone(rate, steps):
    """Issue 52's cases: correct twins (one device, explicit composed), bf16, no warm-up,
    were called divergent at step 14 at a rate of 3e-3 and at step 23 at 1e-2 (2.23 budgets
    over, where a real bug read 2.73): past those steps they agree."""
    report = calibration.run('one_device', 'explicit', 'transformer', 'composed', COMPOSED,
                             'bfloat16', 'float32', {}, steps,
                             train={**NO_WARMUP, 'learning_rate': rate})  # fmt: skip
    print(f'rate {rate}: {report.worst}')
    assert not report.diverged and report.steps == steps, (report.step, report.phase, report.leaves)
    # the loss within a third of its budget (the calibration's criterion): 0.90 and 0.76 before
    # the budget held what a kept cast parameter moves (budgets.cast); the gradients 0.42 and
    # 0.25 before theirs did (budgets.moved)
    assert 0 < report.worst['loss'][1] <= 1 / 3, report.worst
    assert 0 < report.worst['gradients'][1] <= 1 / 3, report.worst


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.parametrize('trained', [0, TRAINED])
def test_no_false_alarm_over_200_steps_at_the_peak_rate_without_warm_up(trained):
    """Correct twins (one device, explicit composed on data:2,fsdp:2,model:2), bf16, at the
    transformer's peak learning rate from the first step, 200 steps from initialisation and from
    a state trained 1,000 steps: no divergence, and the loss and the gradients within a third of
    their budgets (the loss 0.75 from initialisation before budgets.cast, 0.23 after; the
    gradients 0.45 before budgets.moved: docs/numerics.md), the loss's median step at least
    1/30 of its budget."""
    report = calibration.run('one_device', 'explicit', 'transformer', 'composed', COMPOSED,
                             'bfloat16', 'float32', {}, 200, train=NO_WARMUP, trained=trained)  # fmt: skip
    print(f'from step {trained}: {report.worst}')
    assert not report.diverged and report.steps == 200, (report.step, report.phase, report.leaves)
    assert max(f for _, _, f in report.seen) > 0, report.worst  # they differ: round-off judged
    assert report.worst['loss'][1] <= 1 / 3, report.worst
    # the loss's budget is not loose either: its median step at least 1/30 of it (the
    # calibration's other criterion, read over the run's steps). Under the error model's
    # first-order budget it was 0.032 and 0.021; measured (budgets.loss), 0.10 and 0.046
    losses = [f for phase, path, f in report.seen if phase == 'loss' and path == 'loss']
    assert len(losses) == 200 and np.median(losses) >= 1 / 30, np.median(losses)
    # ...and the gradients: 0.45 from initialisation before their budgets held the kept cast
    # (budgets.moved)
    assert report.worst['gradients'][1] <= 1 / 3, report.worst


@pytest.mark.slow
def test_under_dp_a_flip_is_within_budget_and_a_one_percent_gradient_bug_is_caught(monkeypatch):
    """One device against explicit/dp.py on data:2, bf16, seed 1, steps 0 and 1: the sides'
    compiled attention rounds one element a bf16 spacing apart (a flip: the query kernel's
    gradients 6.6e-5 and 2.7e-4 apart, 1e-7 elsewhere; docs/numerics.md, "Flips under dp"),
    which each leaf's budget holds (budgets.flips, from A alone) within a third; every gradient
    scaled by 0.99 in B (tools.zoo.grads_scaled) is caught at the gradients on both steps,
    where the flat budget (4.4% of a leaf) read it "within"."""
    from benchmarks import judging
    from tools.zoo import grads_scaled

    case = judging.Case(axes=(('data', 2), ('model', 1)))
    _, _, _, state, batches, _, _ = judging.inputs(case, 1)
    state = jax.tree.map(np.asarray, state)
    correct = judging.Pair('one_device', 'explicit', case).walk(state, batches, 0, 2)
    query = [e for s in correct for p, leaf, e, _ in s.rows
             if p == 'gradients' and leaf == 'blocks.attn.query.kernel']  # fmt: skip
    print('correct:', [(s.phase, s.worst) for s in correct], 'query kernel', query)
    assert all(s.phase is None and s.worst <= 1 / 3 for s in correct), correct
    assert max(query) > 1e-5, query  # a flip there: they differ by more than float32's 1e-7
    monkeypatch.setattr(grads_scaled, 'SCALE', 0.99)
    bug = judging.Pair('explicit', 'tools.zoo.grads_scaled', case).walk(state, batches, 0, 2)
    print('0.99 x the gradients:', [(s.phase, s.path, s.budgets) for s in bug])
    assert all(s.phase == 'gradients' for s in bug), bug


@pytest.mark.slow
def test_under_dp_the_error_is_the_cut_rows_estimate_or_a_flip():
    """One device against explicit/dp.py on data:2, bf16, no warm-up, seeds 0-2 at step 0 and
    after 1,000 steps: where the sides split only the batch's rows, each gradient leaf's
    estimate is budgets.C_EST x the noise of the probes that cut the rows (A's own program on
    the rows in a random order, in 2 blocks). At each state either the sides' error over it lies
    in [0.3, 3] on 90% of the leaves or more, or a leaf flipped (its error over FLIPPED times
    that noise: a bf16 rounding on either side of a midpoint, which A alone cannot foresee, held
    by the budget's C_FLIP term as a tail; docs/numerics.md, "Flips under dp"). Both happen.
    This holds at these six states, not at every state: over 600 more (2 emulated devices,
    benchmarks.flips) a third of the step-0 states without a flip hold a smaller one, the query
    kernel 3 to 27 times its estimate (docs/numerics.md, "Item 3 under dp")."""
    from benchmarks import flips, judging

    case, rows = judging.Case(axes=(('data', 2), ('model', 1))), []
    pair = judging.Pair('one_device', 'explicit', case)
    for seed in range(3):
        for steps in (0, TRAINED):
            state = (judging.trained(case, seed, steps) if steps
                     else jax.tree.map(np.asarray, judging.inputs(case, seed)[3]))  # fmt: skip
            flips.walk(pair, seed, str(steps), steps, state, 1, rows, jittered=False)
    found = flips.states(rows)
    for (seed, _, step), leaves in found.items():
        print(f'seed {seed} step {step}:', [(p, round(r, 2)) for p, r, _ in leaves])
    flipped = [k for k, leaves in found.items() if any(f for _, _, f in leaves)]
    calm = {k: flips.inside(leaves) for k, leaves in found.items() if k not in flipped}
    assert sum(row[4] > 1e-8 for row in rows) >= len(rows) // 2, rows  # the sides differ
    assert flipped and calm, (flipped, calm)
    assert min(calm.values()) >= 0.9, calm


@pytest.mark.slow
@pytest.mark.exhaustive
def test_no_false_alarm_under_dp_over_200_steps_from_each_state():
    """One device against explicit/dp.py on data:2, bf16 (benchmarks.detection's pair), seed 0,
    200 steps from initialisation and 200 from 300 trained steps, each from A's state: no alarm
    and every step within a third of every budget, where about a fifth of the steps flip an
    element of attention's gradient (budgets.flips holds them; 0 alarms in 1,200 steps over 3
    seeds at 34400a8: docs/detection.md)."""
    from benchmarks import detection, judging

    case = judging.Case(axes=(('data', 2), ('model', 1)))
    out = detection.false_alarms(case, [0], 300, 200, None)
    for label, row in out.items():
        print(f'{label}: alarms {row["alarms"]}, worst {max(row["worst"]):.3g}')
        assert row['steps'] == 200 and not row['alarms'], (label, row['alarms'])
        assert max(row['worst']) <= 1 / 3, (label, max(row['worst']))
    assert max(w for row in out.values() for w in row['worst']) > 3e-3  # flips judged, not none


@pytest.mark.slow
def test_an_agree_states_its_limits_and_shadow_runs_float32_too():
    """The MLP, one device against explicit dp, bf16, one step: the verdict names each phase's
    detection limits, says which are above 1% and offers --shadow=float32, which runs the same
    comparison in float32 and reports it too (exit 0: both agree)."""
    import json
    import subprocess
    import sys

    from parity_tests.helpers import REPO

    flags = ['--model=mlp', '--twins=one_device,explicit', '--dtype=bfloat16', '--steps=1',
             '--cpu_devices=8', '--shadow=float32']  # fmt: skip
    out = subprocess.run([sys.executable, '-m', 'tools.bisect', *flags], cwd=REPO,
                         capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    print(out.stdout)
    bf16, f32 = out.stdout.split('--shadow=float32, the same comparison')
    assert 'agree within bf16 round-off' in bf16 and 'It could not see' in bf16
    for phase in ('forward', 'loss', 'gradients', 'update'):
        assert f'{phase} ' in bf16.split('It could not see')[1], phase
    assert 'Above 1% in ' in bf16 and 'agree for 1 steps (f32)' in f32
    report = json.loads(subprocess.run([sys.executable, '-m', 'tools.bisect', *flags, '--json'],
                                       cwd=REPO, capture_output=True, text=True,
                                       timeout=600, check=True).stdout)  # fmt: skip
    limits = report['report']['limits']
    assert set(limits) == {'forward', 'loss', 'gradients', 'update'}
    assert report['float32']['tolerance'] == 'f32' and not report['float32']['diverged']
