"""Claim: the error model (shard_parity/numerics.py, docs/numerics.md) tells bf16 round-off from
a bug. Correct bf16 twins agree with one device within their budgets (the bisector exits 0
where the f32 tolerance cannot), the bug zoo's entries are still caught in bf16, each by 10
budgets or more, and compare's band passes runs that differ by rounding and fails a doubled
learning rate. The tests print the processor's bf16 support: the budget must hold with and
without avx512_bf16 (XLA:CPU runs bf16 dots natively where it has it)."""

import json
import math
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from benchmarks import numerics as calibration
from parity_tests.helpers import REPO, record_model
from shard_parity import numerics
from shard_parity.tools.bisect import runs

COMPOSED = (('data', 2), ('fsdp', 2), ('model', 2))


def cpu_bf16() -> str:
    try:
        flags = set(pathlib.Path('/proc/cpuinfo').read_text().split())
    except OSError:
        return 'unknown (no /proc/cpuinfo)'
    found = [f for f in ('avx512_bf16', 'amx_bf16') if f in flags]
    return ', '.join(found) or 'neither avx512_bf16 nor amx_bf16 (bf16 dots upcast)'


def test_processor_bf16_support_is_printed(capsys):
    print(f'processor bf16: {cpu_bf16()}')  # the header line docs/numerics.md asks for
    assert 'bf16' in capsys.readouterr().out


def test_the_statistic_is_norm_wise_and_names_what_it_cannot_compare():
    a = np.array([1.0, 1e-6, -2.0])
    b = a.copy()
    b[1] = 1e-3  # one element off by 1e3 relative: per element a bug, norm-wise round-off
    assert numerics.error(a, b) < 1e-3
    assert numerics.error(a, 2 * a) == pytest.approx(0.5)
    assert numerics.error(np.zeros(3), np.zeros(3)) == 0.0
    assert numerics.error(a, [np.nan, 0, 0]) == math.inf
    assert numerics.error(a, a[:2]) == math.inf
    assert numerics.coarser('float32', 'bfloat16') == 'bfloat16'
    with pytest.raises(ValueError, match="no unit round-off for dtype 'int8'"):
        numerics.unit_roundoff('int8')


def test_the_budget_follows_the_policy_the_depth_and_the_devices():
    f32 = numerics.Budget(modules=10)
    bf16 = numerics.Budget('bfloat16', modules=10)
    assert bf16.gradients() > 1e4 * f32.gradients()  # 2^-8 against 2^-24
    assert bf16.forward(1) < bf16.forward(9) and bf16.loss(0.1) < bf16.forward(10)
    wide = numerics.Budget('bfloat16', 'bfloat16', devices=64, modules=10)
    assert wide.gradients() > numerics.Budget('bfloat16', 'bfloat16', 8, 10).gradients()
    assert bf16.update(0.01) < bf16.update(1.0)
    assert numerics.band('bfloat16', 'float32', 50) > numerics.band('bfloat16', 'float32', 0)
    assert numerics.band('bfloat16', 'float32', 300) == numerics.band('bfloat16', 'float32', 3000)


def test_the_loss_budget_holds_float32s_own_rounding():
    """The loss is a mean, and its terms' errors cancel, but not float32's own rounding of the
    sums through the modules, which the sides run in other orders: under a float32 compute with
    a bf16 reduce (the fuzzer's draw, 2026-12-05) the budget is several float32 ulps, where it
    was a tenth of one; under bf16 compute, at the tests' transformer's sensitivity (0.003 at
    256 terms), that term is under 1% of it."""
    u = numerics.unit_roundoff('float32')
    mixed = numerics.Budget('float32', 'bfloat16', devices=4, modules=5, terms=32)
    assert mixed.loss(0.05) >= 5 * u
    bf16 = numerics.Budget('bfloat16', modules=10, terms=512)
    own = numerics.C_OP * u * (numerics.BOUNDARIES * 10) ** 0.5
    assert own < 0.01 * bf16.loss(0.003)


def test_the_loss_budget_carries_each_outputs_rounding_by_its_measured_sensitivity():
    """The loss budget carries each module output's rounding to the loss by the sensitivity
    measured on the batch (tools/bisect/intercept.py's `sensitivities`, Budget.loss). Emulated: every
    output of the MLP times (1 + 1e-3 n), n Gaussian per element, 300 draws; the loss's RMS
    change / (1e-3 |loss|) sits within 25% of the sensitivity, at 4 rows and at 64. A constant
    cannot stand in for it: 16 times the rows cut it by about 4 (sqrt(16): the mean's
    averaging), and the cross-entropy's damping is the logits' size against the loss, which
    separates this MLP from the transformer by about 10 at 256 terms (C_LOSS, once 1/50 fitted
    on the transformer at 256 terms, left the MLP at 4 terms 1.4 budgets over: a fuzzer find,
    2026-12-05, tools/fuzz/corpus/bisect_loss_budget_few_terms.json)."""
    import jax
    from flax import nnx

    from shard_parity.model.mlp import MLP, MLPConfig
    from shard_parity.runtime.tasks import classification_loss
    from tools.bisect.intercept import intercepted, sensitivities

    model = MLP(MLPConfig(), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    bf16 = nnx.split(MLP(MLPConfig(dtype='bfloat16'), rngs=nnx.Rngs(0)))[0]
    rng = np.random.default_rng(0)
    found = {}
    for rows in (4, 64):
        batch = {'image': rng.uniform(0, 1, (rows, 784)).astype(np.float32),
                 'label': rng.integers(0, 10, rows).astype(np.int32)}  # fmt: skip
        clean = float(classification_loss(model, batch)[0])
        found[rows] = sensitivities(graphdef, classification_loss)(params, batch)['loss'] / clean
        # in bf16 compute (each output scaled in its own dtype) the same figure, to bf16's grain
        rounded = sensitivities(bf16, classification_loss)(params, batch)['loss'] / clean
        assert rounded == pytest.approx(found[rows], rel=0.05)

        @jax.jit
        def noisy_loss(key, batch=batch, rows=rows):
            m = nnx.merge(graphdef, params)
            keys = iter(jax.random.split(key, 8))

            def noise(path, module, x, first):
                return x * (1 + 1e-3 * jax.random.normal(next(keys), x.shape))

            with intercepted(m, rows, noise):
                return classification_loss(m, batch)[0]

        moved = [float(noisy_loss(k)) - clean for k in jax.random.split(jax.random.key(1), 300)]
        measured = float(np.sqrt(np.mean(np.square(moved)))) / (1e-3 * abs(clean))
        print(f'{rows} rows: sensitivity {found[rows]:.4f}, emulated {measured:.4f}')
        assert measured == pytest.approx(found[rows], rel=0.25)
    assert 2 < found[4] / found[64] < 8  # about sqrt(16), the mean's averaging


def test_a_count_moves_by_one_term_per_flip():
    """The experts' dropped share is a count (its sensitivity 0): a flipped token takes a slot in
    its new expert's queue and one token there may be dropped for capacity, so each flip moves
    it by one of its T terms, F / (T |m|) relative. The fuzzer's case (2026-12-06: 3 flips in
    128 tokens, the dropped share 0.09 moved by 1.43%, 6.1 budgets over without it) sits
    within a third of it; with no flip only float32's term is left."""
    flipped = numerics.Budget('bfloat16', modules=20, terms=128, flipped=3)
    assert 0.0143 < flipped.loss(0.0, 0.09) / 3
    assert flipped.loss(0.0, 0.09) > 20 * flipped.loss(0.0)  # the loss's flip term alone
    assert numerics.Budget('bfloat16', modules=20, terms=128).loss(0.0, 0.09) < 1e-5


def test_the_forward_budget_holds_float32s_accumulation_in_another_order():
    """A dot split over 'model' adds partial sums, another order of float32's accumulation:
    about u(f32) sqrt(K) norm-wise, which no op boundary counts. Under a float32 compute with a
    bf16 reduce it is the forward's whole budget (the fuzzer's false alarm, 2026-12-05: the
    MLP's last layer 13 float32 ulps apart, 1.8 budgets over); under bf16 compute a few parts
    in ten thousand of it. Measured: the same dot, its contraction split in two and summed,
    against one sum, sits inside it."""
    u = numerics.unit_roundoff('float32')
    mixed = numerics.Budget('float32', 'bfloat16', devices=8, modules=3, contraction=784)
    assert mixed.forward(1) > numerics.C_ACC * u * 28
    assert mixed.forward(1) > 5 * numerics.Budget('float32', 'bfloat16', modules=3).forward(1)
    bf16 = numerics.Budget('bfloat16', modules=3, contraction=784)
    assert bf16.forward(1) < 1.001 * numerics.Budget('bfloat16', modules=3).forward(1)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((64, 784), np.float32), rng.standard_normal((784, 128), np.float32)
    whole = jnp.dot(x, w, precision='highest')
    halves = jnp.dot(x[:, :392], w[:392], precision='highest') + jnp.dot(
        x[:, 392:], w[392:], precision='highest'
    )
    assert 0 < numerics.error(whole, halves) < mixed.forward(1) / 3
    weights = {'a': np.zeros((784, 128)), 'b': np.zeros((3, 32, 128)), 'c': np.zeros(7)}
    assert numerics.widest(weights) == 784


def test_a_flipped_token_is_told_from_a_bug_spread_over_the_tokens():
    """A mixture of experts in bf16: one token of 256 that took another expert is a flip (the
    rest within budget); the same error spread over every token is not, nor are more tokens
    than FLIP_SHARE's flips and the two each may displace (numerics.FLIP_MOVES)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 16, 32))
    b = a * (1 + 1e-3 * rng.standard_normal(a.shape))
    budget = 1e-2
    assert numerics.error(a, b) < budget
    flipped = b.copy()
    flipped[3, 5] = rng.standard_normal(32) * 3  # token 3 x 16 + 5: another expert's output
    assert numerics.error(a, flipped) > budget
    assert numerics.flips(a, flipped, budget) == {3 * 16 + 5}
    assert numerics.error(numerics.without(a, {53}), numerics.without(flipped, {53})) < budget
    spread = a * 1.1  # every token 10% off: a bug
    assert numerics.flips(a, spread, budget) is None
    # each flip may move two more tokens, which capacity drops or lets in: at 256 tokens, 5
    # flips (FLIP_SHARE) and their 10 displaced tokens are flips, one token more is a bug
    many = b.copy()
    moved = rng.choice(256, 16, replace=False)
    many.reshape(256, 32)[moved] = rng.standard_normal((16, 32)) * 3
    assert numerics.flips(a, many, budget) is None
    fifteen = many.copy()
    fifteen.reshape(256, 32)[moved[0]] = b.reshape(256, 32)[moved[0]]
    assert numerics.flips(a, fifteen, budget) == {int(t) for t in moved[1:]}


def test_flips_out_of_the_forwards_sight_are_searched_up_to_a_plausible_count(monkeypatch):
    """Where a pipeline hides a mixture of experts, its flips reach the first output the forward
    sees after it (the final norm): there as many tokens may go as a Poisson count of the
    expected flips reaches but once in 10,000 draws (numerics.plausible), and no more; a step
    that fails there names the flips first, before the rows' pattern (a fuzzer find, 2026-12-05:
    tools/fuzz/corpus/bisect_hidden_flips_reach_the_norm.json, 1.24 budgets over at the norm,
    hinted as a per-device random key)."""
    from tools.bisect import divergence
    from tools.bisect.leaves import Leaf

    assert [numerics.plausible(e) for e in (0, 0.05, 1, 3)] == [0, 2, 6, 11]
    for e in (0.05, 1, 3):  # the Poisson tail beyond the count, and beyond one less
        n = numerics.plausible(e)
        beyond = 1 - sum(math.exp(-e) * e**i / math.factorial(i) for i in range(n + 1))
        assert beyond < numerics.PLAUSIBLE_TAIL <= beyond + math.exp(-e) * e**n / math.factorial(n)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 16, 32))
    b = a * (1 + 1e-3 * rng.standard_normal(a.shape))
    for t in (5, 77, 200):  # three tokens far off, the rest round-off
        b.reshape(-1, 32)[t] = rng.standard_normal(32) * 3
    assert numerics.flips(a, b, 1e-2, most=2) is None
    assert numerics.flips(a, b, 1e-2, most=3) == {5, 77, 200}
    assert numerics.plausible(746) == 850  # exp(-746) underflows: the count, not a hang
    rows = 'only the rows of devices [3, 5, 7] differ: a per-device random key'
    monkeypatch.setattr(divergence, 'hints', lambda leaf, a, b: [rows])
    leaf = Leaf('norm', 0.47, 244.0, blocks=[3, 5, 7], error=0.017, budget=0.0138)
    for suspect, step, said in (
        ([0, 0.3], 0, 'hidden in a pipeline, where 0.3 tokens may take other experts within '
                      'rounding: more tokens than 4 flipped'),  # past the hidden layers
        ([0, 0.0], 0, 'after tokens took other experts'),  # past a counted flip
        (None, 0, None),  # before any: the rows' pattern alone (an embedding's random key)
        ([0, 0.3], 1, None),  # another step's
    ):  # fmt: skip
        report = divergence.Report(('one_device', 'auto'), 'model', 0, model=numerics.Budget())
        report.suspect = suspect
        divergence._diverged(report, step, 'forward', 'norm', [leaf], None, None)
        if said:
            assert len(report.hints) == 2 and said in report.hints[0], report.hints
        assert report.hints[-1] == rows and len(report.hints) == 1 + bool(said), report.hints


def _adamw_step(count_before: int, rate: float = 1e-3):
    """(update, grads, state): AdamW at a constant `rate` from a state that has taken
    `count_before` steps of gradients like `grads` (4,096 elements whose sizes span two orders
    of magnitude); update(g) = the parameters after the step on g."""
    import jax
    import optax

    from shard_parity.step import TrainState, apply_gradients

    rng = np.random.default_rng(1)
    size = lambda: rng.standard_normal(4096) * 10 ** rng.uniform(-2, 0, 4096)  # noqa: E731
    params = {'w': rng.standard_normal(4096).astype(np.float32)}
    tx = optax.adamw(rate, weight_decay=0.1)
    state = TrainState(np.int32(0), params, tx.init(params))
    step = jax.jit(lambda s, g: apply_gradients(s, g, tx))
    for _ in range(count_before):
        state = jax.device_get(step(state, {'w': size().astype(np.float32)}))
    grads = {'w': size().astype(np.float32)}
    return (lambda g: jax.device_get(step(state, g)).params), grads, state


def _flip_law(g, sigma) -> float:
    """AdamW's first step is sign-like: the expected share of elements whose Gaussian rounding
    of `sigma` turns the sign, erfc(|g| / (sigma sqrt 2)) / 2 averaged."""
    return float(np.mean(numerics._crossed(np.abs(g), sigma)))


def test_the_parameters_budget_carries_the_gradients_rounding_through_the_optimizer():
    """numerics.spread moves each parameter as the optimizer's own step does under Gaussian
    gradient rounding at the measured scale: at AdamW's first step (sign-like) it is the flip
    law's 2 sqrt(share flipped) x the update; at the second, a Monte Carlo over 400 roundings
    agrees with its quadrature, and the step moves far less than the flip law says (m and v
    damp it; that law was the parameters' budget until 2026-12-05). A rounding sits well inside
    the budget; an optimizer bug on the same gradient (a learning rate 20% high) leaves it."""
    rng = np.random.default_rng(2)

    def rounded(g):
        return {'w': (g + 1e-4 * rng.standard_normal(g.size)).astype(np.float32)}

    update, grads, state = _adamw_step(0)
    g = grads['w'].astype(np.float64)
    other = rounded(g)
    sigma = np.linalg.norm(other['w'] - g) / math.sqrt(g.size)
    step = np.linalg.norm(update(grads)['w'] - state.params['w'])
    (moved,) = numerics.spread(update, grads, other)
    assert moved == pytest.approx(2 * math.sqrt(_flip_law(g, sigma)) * step, rel=0.1)

    update, grads, state = _adamw_step(1)
    g = grads['w'].astype(np.float64)
    other = rounded(g)
    sigma = np.linalg.norm(other['w'] - g) / math.sqrt(g.size)
    (moved,) = numerics.spread(update, grads, other)
    base = update(grads)['w'].astype(np.float64)
    draws = [np.sum((update(rounded(g))['w'] - base) ** 2) for _ in range(400)]
    assert moved == pytest.approx(math.sqrt(np.mean(draws)), rel=0.1)
    step = np.linalg.norm(base - state.params['w'])
    assert moved < 0.5 * 2 * math.sqrt(_flip_law(g, sigma)) * step

    budget = numerics.Budget('bfloat16').parameters(moved / np.linalg.norm(base))
    assert numerics.error(update(other)['w'], base) < budget / 3
    too_fast, _, _ = _adamw_step(1, rate=1.2e-3)
    assert numerics.error(too_fast(other)['w'], base) > 3 * budget


def test_the_parameters_budget_holds_one_flip_the_mean_does_not_expect():
    """A mean is not a count: at AdamW's first step a leaf whose rounding expects far less than
    one flip still gets one now and then (the fuzzer's corpus entry
    bisect_forward_budget_f32_accumulation: a bias element summed to exactly 0 in bf16 on one
    side, 2.9 sigma of its leaf). Here no gradient is within 100 sigma of zero but one, at 3.2
    sigma, which the other side sums to exactly 0: the mean move alone puts that one flip over
    the budget; with the largest move one plausible flip makes (`flip_z`), it sits inside."""
    update, _, _ = _adamw_step(0)
    rng = np.random.default_rng(3)
    g = np.sign(rng.standard_normal(4096)) * 10 ** rng.uniform(-2, 0, 4096)
    other = g + 1e-4 * rng.standard_normal(g.size)
    g[0] = 3.2e-4
    other[0] = 0  # summed to exactly 0 on one side
    grads, other = {'w': g.astype(np.float32)}, {'w': other.astype(np.float32)}
    base = update(grads)['w']
    error = numerics.error(update(other)['w'], base)
    budget, norm = numerics.Budget('bfloat16'), np.linalg.norm(base)
    (mean,) = numerics.spread(update, grads, other, flip_z=0)
    (moved,) = numerics.spread(update, grads, other)
    assert error > budget.parameters(mean / norm)
    assert error < budget.parameters(moved / norm) / 3


@pytest.mark.parametrize('k', [1, 2])
def test_the_flips_expected_from_router_margins_match_the_flips_measured(k):
    """Where a pipeline hides a mixture of experts from the forward, the flips are expected from
    one side's router margins (tools/bisect/intercept.py's `margins`, numerics.expected_flips): for
    random tokens whose input is rounded at a relative 1e-2 (bf16's budget scale), the expected
    count sits within a factor 2 of the flips counted over 40 roundings; a token on its top-k
    boundary flips half the time, one far from it never."""
    from types import SimpleNamespace

    import jax.numpy as jnp

    from tools.bisect.intercept import margins

    rng = np.random.default_rng(k)
    t, c, e, rounding = 2048, 32, 8, 1e-2
    x = rng.standard_normal((1, t, c)).astype(np.float32)
    router = rng.standard_normal((c, e)).astype(np.float32) / np.sqrt(c)
    moe = SimpleNamespace(cfg=SimpleNamespace(experts_per_token=k), router=jnp.asarray(router))
    expected = numerics.expected_flips(margins(moe, jnp.asarray(x)), rounding)
    chosen = np.sort(np.argsort(-(x @ router), -1)[..., :k], -1)
    counted = []
    for _ in range(40):
        noisy = x * (1 + rounding * rng.standard_normal(x.shape).astype(np.float32))
        other = np.sort(np.argsort(-(noisy @ router), -1)[..., :k], -1)
        counted.append(int(np.any(other != chosen, -1).sum()))
    measured = float(np.mean(counted))
    print(f'k={k}: expected {expected:.2f} flips of {t} tokens, measured {measured:.2f}')
    assert measured > 1 and expected / 2 < measured < expected * 2
    edge = np.array([[0.0, 1.0], [10.0, 1.0], [np.inf, 0.0]])
    assert numerics.expected_flips(edge, rounding) == pytest.approx(0.5, abs=1e-6)


@pytest.mark.parametrize('devices', [2, 8, 64])
def test_a_bf16_all_reduce_rounded_per_hop_sits_within_its_reduce_term(devices, capsys):
    """XLA:CPU carries a bf16 all-reduce in f32, so the CPU cannot show the reduce term: this
    emulates a ring that rounds to bf16 after every hop (the partial sum passed on), over
    gradients of one leaf per device, against the exact sum."""
    rng = np.random.default_rng(devices)
    parts = rng.standard_normal((devices, 4096)) * (1 + rng.random((devices, 1)))
    acc = parts[0].astype(ml_dtypes.bfloat16)
    for p in parts[1:]:  # one hop: add this device's part, round what is sent on
        acc = (acc.astype(np.float32) + p.astype(ml_dtypes.bfloat16).astype(np.float32)).astype(
            ml_dtypes.bfloat16
        )
    err = numerics.error(acc.astype(np.float64), parts.sum(0))
    budget = numerics.Budget('float32', 'bfloat16', devices)._reduce()
    print(
        f'bf16 ring over {devices}: error {err:.3g}, reduce term {budget:.3g} ({err / budget:.2f})'
    )
    assert 0 < err <= budget / 3


def test_run_directories_are_held_to_the_band_along_the_steps():
    """tools/bisect/runs.py's first_difference: a logged loss within the bf16 band at its step agrees;
    the same gap at step 0, or ten bands out later, is the first difference."""
    policy = ('bfloat16', 'float32')
    gap = numerics.band(*policy, 50) * 3.0 * 0.9  # within the band at step 50 for a loss of 3
    a = {0: {'step': 0, 'train_loss': 3.0}, 50: {'step': 50, 'train_loss': 3.0}}
    b = {0: {'step': 0, 'train_loss': 3.0}, 50: {'step': 50, 'train_loss': 3.0 + gap}}
    assert runs.first_difference(a, b, 'model', policy)[0] is None
    assert runs.first_difference(a, b, 'f32')[0] == 50  # the f32 tolerance calls it different
    b[0]['train_loss'] = 3.0 + gap
    assert runs.first_difference(a, b, 'model', policy)[0] == 0


def workdir(tmp_path, name, dtype, losses):
    path = tmp_path / name
    path.mkdir()
    config = {'model': 'transformer', 'model_config': {'dtype': dtype}, 'train': {}}
    (path / 'config.json').write_text(json.dumps(config))
    lines = [{'step': s, 'train_loss': x} for s, x in losses]
    lines.append({'step': losses[-1][0], 'final': True, 'eval_loss': losses[-1][1]})
    (path / 'metrics.jsonl').write_text(''.join(json.dumps(x) + '\n' for x in lines))
    return path


def compare(*args):
    cmd = [sys.executable, '-m', 'tools.compare', *map(str, args)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)


def test_compare_judges_bf16_runs_by_the_band_and_prints_it(tmp_path):
    steps = [(10, 3.0), (100, 2.5)]
    inside = numerics.band('bfloat16', 'float32', 10) * 3.0 / 2  # half the band at step 10
    a = workdir(tmp_path, 'a', 'bfloat16', steps)
    b = workdir(tmp_path, 'b', 'bfloat16', [(10, 3.0 + inside), (100, 2.5)])
    done = compare(a, b)
    assert done.returncode == 0, done.stderr
    assert ' band' in done.stdout.splitlines()[0] and 'band: two runs' in done.stdout
    # how close, and what the band cannot see: a 1% learning rate once read 'largest
    # difference', as the twins do
    assert 'the losses at most 0.5 of the band (train_loss at step 10)' in done.stdout
    assert 'cannot tell round-off from a change that moves a loss by less' in done.stdout
    far = workdir(tmp_path, 'far', 'bfloat16', [(10, 3.0 + 10 * 2 * inside), (100, 2.5)])
    done = compare(a, far)
    assert done.returncode == 1
    assert 'train_loss at step 10 differs by' in done.stderr and 'outside the band' in done.stderr
    assert compare(a, far, '--max_loss_gap=0.01').returncode == 0  # the fixed limit, given
    f32 = workdir(tmp_path, 'f32a', 'float32', steps)
    f32_far = workdir(tmp_path, 'f32b', 'float32', [(10, 3.0 + 10 * 2 * inside), (100, 2.5)])
    assert ' band' not in compare(f32, f32_far).stdout  # float32: the fixed limits, as before


# --- the bisector on bf16 twins (slow: each compiles two sides) ---


def bisect(a, b, model, strategy, axes, extra=None, steps=2, compute='bfloat16'):
    report = calibration.run(a, b, model, strategy, axes, compute, 'float32', extra or {}, steps)
    return record_model(report)  # for python -m tools.margins


@pytest.mark.slow
@pytest.mark.parametrize('twin', ['auto', 'explicit', 'typed'])
def test_correct_bf16_twins_agree_with_one_device_within_the_model(twin):
    """2 steps of the tiny transformer on data:2,fsdp:2,model:2: within budget, where their
    gradients differ by far more than the f32 tolerance (rtol 1e-5) allows."""
    report = bisect('one_device', twin, 'transformer', 'composed', COMPOSED)
    print(f'processor bf16: {cpu_bf16()}; {twin}: {report.worst}')
    assert report.tolerance == 'model' and not report.diverged and report.steps == 2
    fractions = [f for phase, _, f in report.seen if phase == 'gradients']
    assert max(fractions) <= 1 / 3, report.worst  # the calibration's criterion
    budgets = report.limits['gradients']  # the last step's, measured there (probes.py)
    last = [(p, f) for phase, p, f in report.seen if phase == 'gradients'][-len(budgets):]
    assert max(f * budgets[p] for p, f in last) > 1e-4  # they do differ: round-off, not equality


@pytest.mark.slow
def test_context_parallel_and_expert_meshes_agree_with_flips_counted():
    """data:2,seq:2,model:2 (the forward's outputs split over 'seq' are left out, as tp's are:
    at f32 too they were a false alarm on their shapes) and data:2,expert:2,model:2 with 4
    experts, where bf16 flips some tokens' top-2 choice: exit 0, each flip counted."""
    seq = bisect('one_device', 'explicit', 'transformer', 'composed',
                 (('data', 2), ('seq', 2), ('model', 2)))  # fmt: skip
    assert not seq.diverged, (seq.leaves, seq.worst)
    moe = bisect('one_device', 'explicit', 'transformer', 'composed',
                 (('data', 2), ('expert', 2), ('model', 2)),
                 {'num_experts': 4, 'experts_per_token': 2})  # fmt: skip
    print(f'moe: {moe.worst}; flips {moe.flips}')
    assert not moe.diverged, moe.leaves
    assert moe.flips and all(count <= 5 for _, _, count in moe.flips), moe.flips


@pytest.mark.slow
def test_a_pipelines_outputs_are_judged_at_their_depth_in_the_forward():
    """A pipeline (fsdp:2,model:2,stage:2) shows only the outputs after its stages, the final
    norm's and the logits'; each is as many rounding boundaries deep as on a mesh that shows
    every output (data:2,fsdp:2,model:2), so its forward budget is the same, not the first
    boundary's (before, the final norm read 0.475 of its budget from 1,000 trained steps)."""
    pipeline = bisect('one_device', 'explicit', 'transformer', 'composed',
                      (('fsdp', 2), ('model', 2), ('stage', 2)), steps=1)  # fmt: skip
    every = bisect('one_device', 'explicit', 'transformer', 'composed', COMPOSED, steps=1)
    shown = pipeline.limits['forward']
    assert set(shown) == {'norm', 'model'} and len(every.limits['forward']) > 2 * len(shown)
    for path, limit in shown.items():
        assert limit == pytest.approx(every.limits['forward'][path], rel=1e-6), (path, limit)
    assert shown['norm'] > 3 * min(every.limits['forward'].values())  # deep: not the first's


@pytest.mark.slow
def test_the_mlp_under_dp_agrees_within_the_model():
    report = bisect('one_device', 'explicit', 'mlp', 'dp', calibration.DP8)
    assert report.tolerance == 'model' and not report.diverged, report.leaves


MOE = {'num_experts': 4, 'experts_per_token': 2}
GRID = {  # the grid of correct bf16 pairs: (model, strategy, axes, extra, reduce)
    'dp': ('transformer', 'dp', (('data', 8), ('model', 1)), {}, 'float32'),
    'fsdp': ('transformer', 'fsdp', (('fsdp', 8), ('model', 1)), {}, 'float32'),
    'fsdp-reduce-bf16': ('transformer', 'fsdp', (('fsdp', 8), ('model', 1)), {}, 'bfloat16'),
    'tp': ('transformer', 'tp', (('data', 4), ('model', 2)), {}, 'float32'),
    'fsdp_tp': ('transformer', 'fsdp_tp', (('fsdp', 4), ('model', 2)), {}, 'float32'),
    'cp': ('transformer', 'cp', (('data', 2), ('seq', 4)), {}, 'float32'),
    'pp': ('transformer', 'pp', (('data', 4), ('stage', 2)), {}, 'float32'),
    'ep': ('transformer', 'ep', (('data', 2), ('expert', 2)), MOE, 'float32'),
    'composed-reduce-bf16': ('transformer', 'composed', COMPOSED, {}, 'bfloat16'),
    'composed-stage': ('transformer', 'composed', (('fsdp', 2), ('model', 2), ('stage', 2)),
                       {}, 'float32'),
    'composed-seq': ('transformer', 'composed', (('data', 2), ('seq', 2), ('model', 2)), {},
                     'float32'),
    'composed-expert': ('transformer', 'composed', (('data', 2), ('expert', 2), ('model', 2)),
                        MOE, 'float32'),
    'mlp-dp': ('mlp', 'dp', (('data', 8), ('model', 1)), {}, 'float32'),
    'mlp-fsdp': ('mlp', 'fsdp', (('fsdp', 8), ('model', 1)), {}, 'float32'),
}  # fmt: skip


# reduce bf16 in explicit/ only: auto/ and typed/ refuse it (their partitioner reduces a
# gradient where it is formed, before any cast of theirs: docs/numerics.md), in one line
CASES = [(case, twin) for case in GRID for twin in ('auto', 'explicit', 'typed')
         if GRID[case][4] == 'float32' or twin == 'explicit']  # fmt: skip


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.parametrize('case,twin', CASES)
def test_no_false_alarm_in_bf16_on_every_strategy_and_composed_mesh(case, twin):
    """Every strategy file on one mesh, four composed meshes, the MLP under dp and fsdp, in
    every twin, and reduce bf16 on fsdp and the first composed mesh in explicit/: 2 bf16 steps
    against one device, no divergence (the bisector's exit 0), each pair within 1/3 of every
    budget, and the two sides not equal (round-off is there to be judged). Flips are counted,
    not hidden."""
    model, strategy, axes, extra, reduce = GRID[case]
    report = calibration.run('one_device', twin, model, strategy, axes, 'bfloat16', reduce,
                             extra, 2)  # fmt: skip
    record_model(report)
    print(f'{case} {twin}: {report.worst}; flips {report.flips}')
    assert report.tolerance == 'model' and not report.diverged, (report.leaves, report.worst)
    assert max(f for _, _, f in report.seen) <= 1 / 3, report.worst
    assert max(f for _, _, f in report.seen) > 0, report.worst  # they differ


ZOO = {  # entry: (reference, model, strategy, axes, extra, phase, layer) where f32 catches it
    'dp_psum': ('explicit', 'mlp', 'dp', calibration.DP8, {}, 'gradients', None),
    'scatter_no_div': ('one_device', 'mlp', 'fsdp', (('fsdp', 8), ('model', 1)), {},
                       'gradients', None),
    'dropout_key': ('tools.zoo.dropout', 'mlp', 'dp', calibration.DP8, {}, 'forward',
                    'layers.0'),
    'tp_pmean': ('auto', 'transformer', 'tp', (('data', 4), ('model', 2)), {}, 'forward',
                 'blocks.0.attn'),
    'loss_one_short': ('explicit', 'transformer', 'dp', calibration.DP8, {}, 'forward', None),
    'composed_data_only': ('one_device', 'transformer', 'composed',
                           (('data', 2), ('seq', 2), ('model', 2)), {}, 'gradients', None),
    'composed_no_data': ('one_device', 'transformer', 'composed', COMPOSED, {}, 'gradients',
                         None),
    'ep_swapped_axes': ('explicit', 'transformer', 'ep', (('data', 2), ('expert', 2)),
                        {'num_experts': 4, 'experts_per_token': 2}, 'forward', 'blocks.0.ffn'),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize('bug', ZOO)
def test_the_zoo_is_caught_in_bf16_by_ten_budgets(bug):
    reference, model, strategy, axes, extra, phase, layer = ZOO[bug]
    report = bisect(reference, f'tools.zoo.{bug}', model, strategy, axes, extra, steps=1)
    leaf = report.leaves[0]
    print(f'{bug}: step {report.step} {report.phase} {leaf.path}: {leaf.budgets:.3g} budgets')
    assert (report.step, report.phase, report.layer) == (0, phase, layer)
    # 10 budgets where each row's arithmetic is alike on both sides; on a mesh that splits
    # 'model' the measured budgets (tools/bisect/probes.py) are 3x the error at step 0, where
    # the weights are bf16 numbers, to hold correct twins within a third after training
    # (docs/numerics.md, "Measured budgets"): composed_no_data and composed_data_only at 6.6
    assert leaf.budgets >= (5 if dict(axes).get('model', 1) > 1 else 10), leaf
    if bug == 'dp_psum':  # the hint survives bf16: B/A = 8 within the budget
        assert report.ratio == pytest.approx(8.0, rel=0.05), report.ratio


@pytest.mark.slow
@pytest.mark.parametrize('compute', ['bfloat16', 'float32'])
def test_adamw_state_in_bf16_is_caught_by_its_dtypes(compute):
    """tools.zoo.adamw_bf16 keeps AdamW's moments in bf16: in a bf16 run its numbers sit at 0.15
    of the update's budget (measured, the dtype check off), so only the state's element types,
    which the policy fixes at float32, can name it: step 0, phase update, every moment."""
    report = bisect('explicit', 'tools.zoo.adamw_bf16', 'transformer', 'dp', calibration.DP8,
                    steps=1, compute=compute)  # fmt: skip
    assert (report.step, report.phase) == (0, 'update'), report.leaves
    typed = [leaf for leaf in report.leaves if leaf.dtypes]  # (float32 runs: numbers too)
    assert {leaf.path.split('.')[3] for leaf in typed} == {'mu', 'nu'} and all(
        leaf.dtypes == ('float32', 'bfloat16')
        and leaf.path.startswith(('B: opt_state', 'A vs B: opt_state'))
        for leaf in typed
    ), report.leaves  # B's own state against the shared optimizer applied to B's gradient,
    # and (the update judged as the step, b72b9c6) A's state against B's
    assert any(leaf.path.startswith('B: opt_state') for leaf in typed), report.leaves


@pytest.mark.slow
def test_compare_passes_bf16_twins_and_fails_a_doubled_learning_rate(tmp_path):
    """30 steps of a small transformer, bf16: auto against explicit within the band (exit 0);
    explicit with --learning_rate doubled outside it (exit 1)."""
    common = ['--model=transformer', '--num_layers=2', '--num_heads=4', '--embed_dim=32',
              '--seq_len=16', '--batch_size=16', '--mesh=data:2,fsdp:2,model:2',
              '--cpu_devices=8', '--steps=30', '--log_every=1', '--eval_every=30',
              '--dtype=bfloat16']  # fmt: skip
    for twin, extra in (('auto', []), ('explicit', []), ('explicit', ['--learning_rate=0.002'])):
        name = twin + ('_lr' if extra else '')
        done = subprocess.run(
            [sys.executable, '-m', f'{twin}.train', *common, *extra, f'--workdir={tmp_path / name}'],
            cwd=REPO, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    agree = compare(tmp_path / 'auto', tmp_path / 'explicit')
    assert agree.returncode == 0, agree.stdout[-3000:] + agree.stderr
    apart = compare(tmp_path / 'auto', tmp_path / 'explicit_lr', '--allow_other_settings')
    assert apart.returncode == 1 and 'outside the band' in apart.stderr, apart.stderr


@pytest.mark.slow
@pytest.mark.exhaustive
def test_compare_over_300_bf16_steps_keeps_twins_in_the_band_and_a_doubled_rate_out(tmp_path):
    """The issue's run: 300 steps of a small transformer in bf16, auto against explicit within
    the band (measured 2026-12-05: the largest gap 0.0041 against a band of 0.05); explicit with
    the learning rate doubled outside it. About 30 s a run alone. The smallest change the band
    sees at 300 steps lies between 5% (largest difference 0.0475, inside) and 7% (0.0536 at
    step 40 against 0.0451, outside): docs/numerics.md."""
    common = ['--model=transformer', '--num_layers=2', '--num_heads=4', '--embed_dim=32',
              '--seq_len=16', '--batch_size=16', '--mesh=data:2,fsdp:2,model:2',
              '--cpu_devices=8', '--steps=300', '--log_every=10', '--eval_every=300',
              '--dtype=bfloat16']  # fmt: skip
    for twin, extra in (('auto', []), ('explicit', []), ('explicit', ['--learning_rate=0.002'])):
        name = twin + ('_lr' if extra else '')
        done = subprocess.run(
            [sys.executable, '-m', f'{twin}.train', *common, *extra, f'--workdir={tmp_path / name}'],
            cwd=REPO, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    agree = compare(tmp_path / 'auto', tmp_path / 'explicit')
    assert agree.returncode == 0, agree.stdout[-3000:] + agree.stderr
    gaps = [float(line.split()[-2]) for line in agree.stdout.splitlines()
            if line.split()[1:2] == ['train_loss']]  # the table's rows: step, name, ...
    assert len(gaps) == 30 and 0 < max(gaps), agree.stdout  # they differ: not one run twice
    apart = compare(tmp_path / 'auto', tmp_path / 'explicit_lr', '--allow_other_settings')
    assert apart.returncode == 1 and 'outside the band' in apart.stderr, apart.stderr
