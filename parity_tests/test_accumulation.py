"""Claim: --gradient_accumulation_steps=K (docs/accumulation.md) is the step of one device at
the full batch. Each twin's loss_and_grads, K microbatches of B/K rows per device, gives the
gradient of one device's plain step on the whole batch of B: within float32 round-off in
float32, within the bf16 error model (shard_parity/numerics.py) in bf16; for K in 1, 2, 4 and
a partial last window (3 of 4 microbatches, weighted by its tokens), on dp, fsdp and a composed
mesh, in all three twins; the transformer's variable-length documents give the microbatches
unequal token counts, so a per-microbatch mean would show on full windows. First, the things
compared can differ: a loss averaged per microbatch, and a partial window weighted by K, are
off by far more than the tolerance. Bad K: one line, exit 2 (test_bad_inputs' style, here)."""

import dataclasses
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from parity_tests.helpers import (
    CLI_MODELS,
    REPO,
    TOL,
    assert_close,
    assert_same_params,
    make_case,
    mesh_of,
    plan_of,
    read_metrics,
    run_cli,
    strategy_mesh,
)  # fmt: skip
from shard_parity import UsageError, auto, explicit, numerics, typed
from shard_parity import config as cfg
from shard_parity import plan as plans
from shard_parity.datasets.batches import loss_weights, partial_window
from shard_parity.model.mlp import MLP
from shard_parity.placement import place_batch, place_state
from shard_parity.plan import Precision
from shard_parity.runtime import tasks
from shard_parity.step import (
    Accumulated,
    check_accumulation,
    create_state,
    make_optimizer,
    one_device_loss_and_grads,
    strategy_file,
)  # fmt: skip

TWINS = (auto, explicit, typed)
WINDOWS = [(1, 1), (2, 2), (4, 4), (4, 3)]  # (K, microbatches present): the last one partial
MESHES = {'dp': None, 'fsdp': None, 'composed': 'data:2,fsdp:2,model:2'}


def mlp_case(dtype='float32'):
    case = make_case('mlp')
    return case._replace(make_model=lambda rngs: MLP(cfg.MLPConfig(dtype=dtype), rngs=rngs))


def documents_case():
    """The tiny transformer on variable-length documents: each row's tokens a random count;
    32 rows, 4 a device on 8, so that K=4 splits them."""
    case = make_case('transformer')
    case.batches.documents, case.batches.batch_size = True, 32
    return case


def window(case, k, present):
    batch = case.batches.batch(0)
    return batch if present == k else partial_window(batch, k, present)


def one_device(case, batch):
    graphdef, params = nnx.split(case.make_model(nnx.Rngs(0)))
    return one_device_loss_and_grads(graphdef, case.loss_fn)(params, batch)


def twin_call(twin, strategy, case, batch, k):
    """(metrics, grads) of `twin`'s loss_and_grads on `strategy`'s mesh with K microbatches."""
    named = MESHES[strategy]
    mesh = mesh_of(named, twin) if named else strategy_mesh(strategy, twin=twin)
    plan = plan_of(mesh, strategy)
    graphdef, state = create_state(case.make_model(nnx.Rngs(0)), make_optimizer(case.config))
    fn = strategy_file(twin, plan).loss_and_grads(
        graphdef, Accumulated(case.loss_fn, k), mesh, plan
    )
    placed = place_state(jax.tree.map(np.array, state), mesh, plan)
    metrics, grads = fn(placed.params, place_batch(batch, mesh, plan))
    return jax.device_get(metrics), jax.device_get(grads)


def assert_equal_to_one_device(got, want):
    (metrics, grads), (ref_metrics, ref_grads) = got, want
    assert_close(metrics['loss'], ref_metrics['loss'], 'loss', **TOL)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        assert_close(g, r, 'gradient', **TOL)


def bisect_in_bf16(twin, strategy, case, k, present):
    """One step of the bisector, one device at the full batch against `twin` with K
    microbatches, in bf16: its error model's budgets (tolerance 'model': each gradient leaf's
    from its own measured rounding noise, docs/numerics.md), as a bf16 run is judged."""
    from shard_parity.tools.bisect import divergence as D

    named = MESHES[strategy]
    mesh = mesh_of(named, explicit) if named else strategy_mesh(strategy)
    plan = plan_of(mesh, strategy, precision=Precision(compute='bfloat16'))
    graphdef, state = create_state(case.make_model(nnx.Rngs(0)), make_optimizer(case.config))
    state = jax.tree.map(np.array, state)
    sides = [D.load_side(n, plan, mesh) for n in ('one_device', twin.NAME)]
    batches = type('Window', (), {'batch': lambda self, step: window(case, k, present)})()
    loss_fn = Accumulated(case.loss_fn, k)
    return D.bisect(*sides, graphdef, loss_fn, make_optimizer(case.config), state, batches, 1)


def test_the_compared_gradients_can_differ():
    """The two normalisations the issue names as bugs move the gradient by far more than TOL:
    a partial window weighted by K (its weights normalised as if all K microbatches were
    there), and the transformer's loss averaged per microbatch of unequal token counts."""
    case = mlp_case()
    batch = window(case, 4, 3)
    by_k = {**batch, 'weight': loss_weights(np.ones_like(batch['weight'])) * (batch['weight'] > 0)}
    leaf = lambda t: np.asarray(jax.tree.leaves(t)[0])
    want, wrong = one_device(case, batch), one_device(case, by_k)
    assert numerics.error(leaf(wrong[1]), leaf(want[1])) > 0.2  # 3/4 of the gradient
    docs = documents_case()
    batch = docs.batches.batch(0)
    whole = one_device(docs, batch)[1]
    parts = [{k: v[j::2] for k, v in batch.items()} for j in range(2)]  # each its own mean
    per_part = [one_device(docs, {**p, 'weight': loss_weights(p['weight'] > 0)})[1] for p in parts]
    mean = jax.tree.map(lambda a, b: (a + b) / 2, *per_part)
    assert numerics.error(leaf(mean), leaf(whole)) > 100 * TOL['rtol']


@pytest.mark.parametrize('k, present', [(4, 3)])  # all of WINDOWS: the slow tier's
@pytest.mark.parametrize('twin', TWINS, ids=lambda t: t.NAME)
def test_dp_equals_one_device_at_the_full_batch(twin, k, present):
    case = mlp_case()
    batch = window(case, k, present)
    want = one_device(case, batch)
    assert_equal_to_one_device(twin_call(twin, 'dp', case, batch, k), want)


@pytest.mark.slow
@pytest.mark.parametrize('strategy', ['dp', 'fsdp', 'composed'])
@pytest.mark.parametrize('twin', TWINS, ids=lambda t: t.NAME)
def test_each_strategy_equals_one_device_in_float32(twin, strategy):
    case = mlp_case()
    for k, present in WINDOWS:
        batch = window(case, k, present)
        assert_equal_to_one_device(
            twin_call(twin, strategy, case, batch, k), one_device(case, batch)
        )


@pytest.mark.slow
@pytest.mark.parametrize('strategy', ['dp', 'fsdp', 'composed'])
@pytest.mark.parametrize('twin', TWINS, ids=lambda t: t.NAME)
def test_each_strategy_equals_one_device_within_the_bf16_error_model(twin, strategy):
    """A partial window, 3 of K=4 microbatches (K=1's bf16 parity is the twins' own tests';
    float32 above has every window): the bisector finds no divergence at the step's loss or
    any gradient leaf."""
    case = mlp_case('bfloat16')
    for k, present in [(4, 3)]:
        report = bisect_in_bf16(twin, strategy, case, k, present)
        assert not report.diverged and report.tolerance == 'model', report


@pytest.mark.slow
@pytest.mark.parametrize('strategy', ['dp', 'fsdp', 'composed'])
@pytest.mark.parametrize('twin', TWINS, ids=lambda t: t.NAME)
def test_documents_of_unequal_lengths_weigh_by_their_tokens(twin, strategy):
    """The transformer on variable-length documents: every microbatch a different count of
    real tokens, in full windows and a partial one; the loss a mean over the step's tokens."""
    case = documents_case()
    for k, present in WINDOWS[2:]:  # K=4: a full window and a partial one
        batch = window(case, k, present)
        want = one_device(case, batch)
        assert_equal_to_one_device(twin_call(twin, strategy, case, batch, k), want)


# --- The CLI: bad K, a run with K, and a SIGTERM inside a run with K. ---

MLP_FLAGS = [*CLI_MODELS['mlp'], '--cpu_devices=8', '--steps=1']


@pytest.mark.parametrize(
    'flag, fragment',
    [
        pytest.param(
            '--gradient_accumulation_steps=0', '0 is not a positive integer', marks=pytest.mark.slow
        ),
        ('--gradient_accumulation_steps=3', 'does not divide the 8 rows each device'),
    ],
)
def test_a_bad_k_is_one_line_and_exit_2(flag, fragment, tmp_path):
    out = run_cli('explicit', *MLP_FLAGS, flag, f'--workdir={tmp_path}')
    assert out.returncode == 2 and fragment in out.stderr and 'Traceback' not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_pipeline_refuses_k_saying_why():
    plan = plans.parse('data:4,stage:2', None, 8)
    with pytest.raises(UsageError, match=r'gradient of --microbatches=2 x M: raise that'):
        check_accumulation(plan, 16, 2)
    check_accumulation(plan, 16, 1)  # K=1: nothing to refuse
    check_accumulation(plans.parse('data:4,model:2', None, 8), 16, 4)  # 4 rows per device


def test_variable_length_is_the_transformers():
    config = dataclasses.replace(cfg.TrainConfig(), variable_length=True)
    with pytest.raises(UsageError, match='--variable_length cuts text into documents'):
        tasks.mnist_task(config)


TRANSFORMER = [*CLI_MODELS['transformer'], '--cpu_devices=8', '--log_every=1', '--eval_every=10']
TRANSFORMER += ['--batch_size=32']  # 4 rows a device: K=4 splits them


@pytest.mark.slow
def test_a_run_with_k_follows_the_run_without(tmp_path):
    """Ten steps of the transformer on documents: K=4 logs the losses of K=1 within float32's
    round-off (LOSS_TOL's error model: an average over the batch) in every twin."""
    runs = {}
    for twin, k in [('auto', 1), ('auto', 4), ('explicit', 4), ('typed', 4)]:
        workdir = tmp_path / f'{twin}{k}'
        flags = [*TRANSFORMER, '--steps=10', '--variable_length', f'--workdir={workdir}']
        out = run_cli(twin, *flags, f'--gradient_accumulation_steps={k}')
        assert out.returncode == 0, out.stderr[-2000:]
        runs[twin, k] = [m['train_loss'] for m in read_metrics(workdir) if 'train_loss' in m]
    for key, losses in runs.items():
        assert len(losses) == 10
        assert_close(losses, runs['auto', 1], f'{key}', rtol=1e-5, atol=0)


@pytest.mark.slow
def test_a_run_ends_each_epoch_on_its_partial_window(tmp_path):
    """The MLP's 8,000 examples at batch 1,024 and K=2: 7 whole steps, then the 832 left hold one
    whole microbatch of 512, so step 7 is a partial window (datasets/batches.py). The train CLI
    runs through it on data:8 in two twins as on one device (float32 round-off), and its loss
    is the mean over its 512 examples: weighted by K instead, it would read about half."""
    losses = {}
    for twin, where in (('explicit', '--cpu_devices=8'), ('auto', '--cpu_devices=8'),
                        ('auto', '--cpu_devices=1')):  # fmt: skip
        workdir = tmp_path / f'{twin}{where[-1]}'
        flags = ['--model=mlp', '--batch_size=1024', '--steps=9', '--log_every=1', where]
        out = run_cli(twin, *flags, '--gradient_accumulation_steps=2', f'--workdir={workdir}')
        assert out.returncode == 0, out.stderr[-2000:]
        losses[twin, where] = [m['train_loss'] for m in read_metrics(workdir) if 'train_loss' in m]
    one = losses['auto', '--cpu_devices=1']
    assert len(one) == 9 and 0.6 < one[7] / one[6] < 1.5 and 0.6 < one[8] / one[6] < 1.5
    k1 = tmp_path / 'k1'  # K=1 drops the remainder: the same steps 0-6, then another step 7
    assert run_cli('auto', '--model=mlp', '--batch_size=1024', '--steps=8', '--log_every=1',
                   '--cpu_devices=1', f'--workdir={k1}').returncode == 0  # fmt: skip
    dropped = [m['train_loss'] for m in read_metrics(k1) if 'train_loss' in m]
    assert_close(dropped[:7], one[:7], 'K=1, steps 0-6', rtol=1e-5, atol=0)
    assert abs(dropped[7] - one[7]) > 1e-3 * one[7]
    for key, got in losses.items():
        assert_close(got, one, f'{key}', rtol=1e-5, atol=0)


@pytest.mark.slow
def test_a_sigterm_inside_a_window_resumes_to_an_undisturbed_run(tmp_path):
    """The K microbatches are one jitted step: a signal lands between optimizer steps, the
    checkpoint is a step boundary, and the resumed run ends bitwise where the straight one does."""
    flags = [*TRANSFORMER, '--steps=40', '--checkpoint_every=10', '--decay_steps=400']
    flags += ['--gradient_accumulation_steps=2', '--variable_length']
    run = [*flags, f'--workdir={tmp_path / "run"}']
    proc = subprocess.Popen(
        [sys.executable, '-u', '-m', 'explicit.train', *run],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen = ''
    while 'step 10:' not in seen:
        seen += proc.stdout.read(1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143 and 'interrupted at' in err, err[-2000:]
    assert run_cli('explicit', *run).returncode == 0
    straight = run_cli('explicit', *flags, f'--workdir={tmp_path / "straight"}')
    assert straight.returncode == 0, straight.stderr[-2000:]
    assert_same_params(tmp_path / 'run', tmp_path / 'straight')


def test_the_default_loss_is_the_plain_mean_without_a_mask():
    """K=1 and no mask: the loss is `.mean()` as before, so recorded figures do not move; a
    mask of ones gives the same loss (its weights are exactly 1)."""
    case = mlp_case()
    batch = case.batches.batch(0)
    plain = one_device(case, batch)
    ones = one_device(case, {**batch, 'weight': loss_weights(np.ones(len(batch['label'])))})
    np.testing.assert_array_equal(plain[0]['loss'], ones[0]['loss'])
    assert dataclasses.replace(cfg.TrainConfig()).gradient_accumulation_steps == 1


def test_typed_holds_the_accumulator_unreduced(monkeypatch):
    """typed/dp.py's accumulator, read while the step is traced (nothing compiles): the weights'
    gradients enter the loop `unreduced` over 'data' (each device's partial sum), so the add
    over the K microbatches is local and the twin's reshard reduces once, after the loop."""
    carried = []
    fori_loop = jax.lax.fori_loop

    def spy(lower, upper, body, init):
        carried.extend(str(jax.typeof(x)) for x in jax.tree.leaves(init[1]))
        return fori_loop(lower, upper, body, init)

    monkeypatch.setattr(jax.lax, 'fori_loop', spy)
    case = mlp_case()
    mesh = strategy_mesh('dp', twin=typed)
    plan = plan_of(mesh, 'dp')
    graphdef, state = create_state(case.make_model(nnx.Rngs(0)), make_optimizer(case.config))
    fn = typed.dp.loss_and_grads(graphdef, Accumulated(case.loss_fn, 2), mesh, plan)
    placed = place_state(jax.tree.map(np.array, state), mesh, plan)
    fn.trace(placed.params, place_batch(case.batches.batch(0), mesh, plan))
    kernels = [t for t in carried if t.startswith('float32[784,512]')]
    assert kernels and all('U:data' in t for t in kernels), carried
