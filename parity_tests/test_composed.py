"""Claim: every axis composed on one N-D mesh (<twin>/composed.py) gives the one-device run's
loss and every gradient leaf, in all three twins, on data x fsdp (HSDP), data x fsdp x model,
fsdp x model x stage, data x seq x model, stage x seq x model (a ring in each stage), data x
expert x model, stage x expert and data x fsdp x expert with experts, and the 4-D
data:2,fsdp:2,model:2,stage:2 on 16 devices; on each mesh in each twin 20 AdamW steps track it
(float32 losses, float64 parameters); each composition's planted mistake (a gradient averaged
over an axis where it must not be, or not where it must: tools/zoo/composed_*.py) is caught;
checkpoints move between meshes with bitwise logits, and a run resumes on another mesh to the
figures of a straight run."""

import dataclasses
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from parity_tests.helpers import (
    mesh_of,
    LOSS_TOL,
    REPO,
    TOL,
    X64_TOL,
    assert_close,
    assert_params_close,
    assert_trees_close,
    fresh_state,
    logits,
    make_case,
    one_device_grads,
    plan_of,
    read_metrics,
    run_cli,
    save_checkpoint,
    train_twin,
)
from parity_tests.wide import one_device_runs, train_twin_x64
from shard_parity import auto, explicit, typed
from shard_parity.placement import place_batch, place_state
from shard_parity.runtime import checkpoint
from shard_parity import config as cfg
from shard_parity.step import one_device_loss_and_grads
from shard_parity.tools.zoo import composed_data_only, composed_no_data, composed_too_many

TWINS = {'auto': auto, 'explicit': explicit, 'typed': typed}
# 4 layers (1 or 2 per stage), 4 query heads and 2 key/value heads (whole ones on 2 'model'
# devices), 16 positions (2 zigzag chunks on each of 2 'seq' devices, 4 on 4).
DENSE = cfg.TransformerConfig(seq_len=16, num_layers=4, num_heads=4, num_kv_heads=2, embed_dim=32)
MOE = dataclasses.replace(DENSE, num_experts=4, experts_per_token=2)  # with drops (capacity 10)
# mesh -> (model, the planted mistake its test catches): each axis in at least one
MESHES = {
    'data:2,fsdp:4': (DENSE, composed_no_data),
    'data:2,fsdp:2,model:2': (DENSE, composed_too_many),
    'fsdp:2,model:2,stage:2': (DENSE, composed_too_many),
    'data:2,seq:2,model:2': (DENSE, composed_data_only),
    'data:2,expert:2,model:2': (MOE, composed_data_only),
    'stage:2,expert:4': (MOE, composed_data_only),
    'stage:2,seq:2,model:2': (DENSE, composed_data_only),  # a ring inside each stage
    'data:2,fsdp:2,expert:2': (MOE, composed_no_data),  # experts with their state split
}
SIXTEEN = 'data:2,fsdp:2,model:2,stage:2'
GRID = [(t, m) for t in TWINS for m in MESHES]
SLOW_ONLY = {'stage:2,seq:2,model:2', 'data:2,fsdp:2,expert:2'}  # each axis is fast elsewhere
FAST = {('explicit', m) for m in MESHES if m not in SLOW_ONLY} | {('auto', 'data:2,fsdp:2,model:2')}
CASES = [pytest.param(*c, marks=[] if c in FAST else [pytest.mark.slow]) for c in GRID]


@pytest.fixture(scope='module')
def one_device():
    """model config -> the one-device run's (case, metrics, gradients), computed once."""
    return one_device_grads()


def composed_loss_and_grads(module, case, mesh):
    graphdef, _, state = fresh_state(case=case)
    fn = module.loss_and_grads(
        graphdef, case.loss_fn, mesh, plan_of(mesh, module.STRATEGY, microbatches=2)
    )
    placed = place_state(jax.tree.map(np.array, state), mesh, plan_of(mesh, 'composed'))
    return fn(placed.params, place_batch(case.batches.batch(0), mesh, plan_of(mesh, 'composed')))


@pytest.mark.parametrize('name, mesh', CASES, ids=[f'{t}-{m}' for t, m in GRID])
def test_composed_matches_the_one_device_run(name, mesh, one_device):
    """One step in float32: the loss (with experts, the auxiliary loss and dropped share too)
    and every gradient leaf."""
    config, _ = MESHES[mesh]
    case, want_metrics, want_grads = one_device(config)
    twin = TWINS[name]
    metrics, grads = composed_loss_and_grads(twin.composed, case, mesh_of(mesh, twin))
    assert_trees_close(metrics, want_metrics, **TOL)
    assert_trees_close(grads, want_grads, **TOL)


@pytest.mark.parametrize('mesh', MESHES)
def test_each_compositions_planted_mistake_is_caught(mesh, one_device):
    """The comparison can fail: the mistake planted for this mesh (averaging a gradient over
    'model' or 'stage', whose devices hold different shards of it; or not over 'data', 'seq'
    or the experts' rows) moves some gradient leaf beyond the tolerance."""
    config, planted = MESHES[mesh]
    case, _, want_grads = one_device(config)
    _, grads = composed_loss_and_grads(planted, case, mesh_of(mesh))
    with pytest.raises(AssertionError):
        assert_trees_close(grads, want_grads, **TOL)


def test_the_mlp_composes_too(one_device):
    """The MLP on data x fsdp x model: no stacked layers, so fsdp gathers every weight once."""
    case = make_case('mlp')
    graphdef, _, state = fresh_state(case=case)
    want = one_device_loss_and_grads(graphdef, case.loss_fn)(state.params, case.batches.batch(0))
    for name in ('explicit', 'auto'):
        mesh = mesh_of('data:2,fsdp:2,model:2', TWINS[name])
        got = composed_loss_and_grads(TWINS[name].composed, case, mesh)
        assert_trees_close(got, want, **TOL)


@pytest.mark.slow
def test_a_4d_mesh_on_16_devices():
    """data:2,fsdp:2,model:2,stage:2 needs 16 devices, and this process has 8: the same test
    file runs it in a pytest of its own on 16 (SHARD_PARITY_TEST_DEVICES, conftest.py)."""
    if jax.device_count() == 16:
        pytest.skip('run by test_the_4d_mesh_on_16_devices_in_all_twins')
    env = dict(os.environ, SHARD_PARITY_TEST_DEVICES='16')
    test = 'parity_tests/test_composed.py::test_the_4d_mesh_on_16_devices_in_all_twins'
    result = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', test],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert '3 passed' in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize('name', TWINS)
def test_the_4d_mesh_on_16_devices_in_all_twins(name, one_device):
    """One step against the one-device run, 20 steps tracking it, and the planted mistake."""
    if jax.device_count() != 16:
        pytest.skip('needs 16 devices: test_a_4d_mesh_on_16_devices runs it in a process of them')
    case, want_metrics, want_grads = one_device(DENSE)
    twin = TWINS[name]
    metrics, grads = composed_loss_and_grads(twin.composed, case, mesh_of(SIXTEEN, twin))
    assert_trees_close(metrics, want_metrics, **TOL)
    assert_trees_close(grads, want_grads, **TOL)
    track_20_steps(twin, mesh_of(SIXTEEN, twin), DENSE)
    if name == 'explicit':  # the 4-D mesh's planted mistake: averaged over 'model' and 'stage'
        _, grads = composed_loss_and_grads(composed_too_many, case, mesh_of(SIXTEEN))
        with pytest.raises(AssertionError):
            assert_trees_close(grads, want_grads, **TOL)


# every mesh in every twin (about 8 s each): in the suite explicit's on three meshes that hold
# every axis between them, the rest in the exhaustive tier (one step of each is checked on every
# mesh above); the 4-D mesh's run on 16 below
TRACKED = ('data:2,fsdp:4', 'stage:2,expert:4', 'data:2,seq:2,model:2')
TRAJECTORIES = [
    pytest.param(t, m, marks=[] if t == 'explicit' and m in TRACKED else [pytest.mark.exhaustive])
    for t, m in GRID
]


@pytest.mark.slow
@pytest.mark.parametrize('name, mesh', TRAJECTORIES, ids=[f'{t}-{m}' for t, m in GRID])
def test_20_steps_composed_track_the_one_device_run(name, mesh):
    """20 AdamW steps: the float32 losses step by step, and every loss and parameter of the
    float64 rerun (helpers.py's error model)."""
    track_20_steps(TWINS[name], mesh_of(mesh, TWINS[name]), MESHES[mesh][0])


def track_20_steps(twin, mesh, config):
    case = make_case('transformer', config)
    want_32, want_64 = one_device_runs(case)
    losses, _ = train_twin(twin, mesh, case, strategy='composed')
    assert_close(losses, want_32[0], 'float32 losses', **LOSS_TOL)
    losses, params = train_twin_x64(twin, mesh, case, strategy='composed')
    assert_close(losses, want_64[0], 'float64 losses', **X64_TOL)
    assert_params_close(params, want_64[1], **X64_TOL)


MOVES = {
    'dp-to-3d': (('dp', 'data:8'), 'data:2,fsdp:2,model:2'),
    '3d-to-pp-tp': (('composed', 'data:2,fsdp:2,model:2'), 'fsdp:2,model:2,stage:2'),
    'pp-tp-to-cp-tp': (('composed', 'fsdp:2,model:2,stage:2'), 'data:2,seq:2,model:2'),
}


@pytest.mark.parametrize('saved, restored', MOVES.values(), ids=MOVES)
def test_checkpoints_move_between_meshes(saved, restored, tmp_path):
    """Saved on one mesh, restored on another: every array equal, and the logits bitwise."""
    case = make_case('transformer', DENSE)
    graphdef, _, state = fresh_state(case=case)
    strategy, text = saved
    state = place_state(state, mesh_of(text), plan_of(mesh_of(text), strategy))
    save_checkpoint(tmp_path, state, case, DENSE)
    tokens = case.batches.batch(0)['x']
    one = jax.devices()[0]  # logits on one device: both sides run the very same program
    before = logits(graphdef, state.params, tokens, one)
    mesh = mesh_of(restored)
    _, graphdef2, back = checkpoint.restore(tmp_path, mesh, plan_of(mesh, 'composed'))
    kernel = lambda s: s.params['blocks']['attn']['query']['kernel'][...]  # noqa: E731
    assert kernel(back).sharding.spec != kernel(state).sharding.spec  # the layouts differ
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(logits(graphdef2, back.params, tokens, one), before)


SHAPE = ['--model=transformer', '--seq_len=16', '--num_layers=4', '--num_heads=4',
         '--num_kv_heads=2', '--embed_dim=32', '--batch_size=16', '--microbatches=2',
         '--eval_every=10', '--cpu_devices=8', '--warmup_steps=2', '--decay_steps=20']  # fmt: skip


@pytest.mark.slow
def test_a_run_resumes_on_another_mesh(tmp_path):
    """A preempted job restarted on another slice: 10 steps on data:2,fsdp:2,model:2, then 10
    more on fsdp:2,model:2,stage:2 from its checkpoint, end where 20 straight steps on the
    first mesh end (float32 round-off: another mesh sums in another order)."""
    first, second = 'data:2,fsdp:2,model:2', 'fsdp:2,model:2,stage:2'
    straight, resumed = tmp_path / 'straight', tmp_path / 'resumed'
    for workdir, mesh, steps in (
        (straight, first, 20),
        (resumed, first, 10),
        (resumed, second, 20),
    ):
        result = run_cli('explicit', *SHAPE, f'--mesh={mesh}', f'--steps={steps}',
                         f'--workdir={workdir}', '--log_every=1')  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
    assert 'resuming from' in result.stderr
    want = {m['step']: m for m in read_metrics(straight) if 'train_loss' in m}
    got = {m['step']: m for m in read_metrics(resumed) if 'train_loss' in m}
    assert sorted(got) == sorted(want) == list(range(1, 21))
    assert_close([got[s]['train_loss'] for s in range(1, 21)],
                 [want[s]['train_loss'] for s in range(1, 21)], 'losses', **LOSS_TOL)  # fmt: skip
    final = lambda w: [m for m in read_metrics(w) if m.get('final')][-1]  # noqa: E731
    assert_close(final(resumed)['eval_loss'], final(straight)['eval_loss'], 'eval', **LOSS_TOL)
    assert '"stage": 2' in (resumed / 'config.json').read_text()  # the second mesh's


@pytest.mark.slow
def test_cli_trains_on_a_named_mesh(tmp_path):
    """--mesh=data:2,fsdp:2,model:2 runs the composed step; config.json records the mesh."""
    result = run_cli('typed', *SHAPE, '--mesh=data:2,fsdp:2,model:2', '--steps=2',
                     f'--workdir={tmp_path}')  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    saved = (tmp_path / 'config.json').read_text()
    assert '"strategy": "composed"' in saved and '"fsdp": 2' in saved
