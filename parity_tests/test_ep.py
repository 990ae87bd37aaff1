"""Claim: expert parallelism (--strategy=ep) splits the experts of a mixture-of-experts
transformer over the mesh's 'expert' axis and gives the one-device run's loss, auxiliary loss,
dropped share and every gradient leaf, in all three twins, with E = 4 and 8 experts, K = 1 and
2, with drops (capacity factor 1.0) and without; 20 AdamW steps track it (explicit, auto); the one-device
reference (a plain loop over the experts) equals the batched dispatch; the dense model is the
dense model; a variant whose all_to_alls run over the wrong mesh axis is caught; checkpoints
move between dp and ep with bitwise logits; the train CLI runs it."""

import dataclasses

import jax
import numpy as np
import pytest

from parity_tests.helpers import (
    LOSS_TOL,
    REDUCES_PER_AXIS,
    TOL,
    X64_TOL,
    assert_close,
    assert_params_close,
    assert_trees_close,
    fresh_state,
    inspect_collectives,
    logits,
    make_case,
    plan_of,
    read_metrics,
    run_cli,
    save_checkpoint,
    train_twin,
    twin_loss_and_grads,
)
from parity_tests.wide import one_device_runs, train_twin_x64
from shard_parity import auto, explicit, typed
from shard_parity.mesh import make_mesh
from shard_parity.model import moe
from shard_parity import checks
from shard_parity.placement import mesh_axes, place_batch, place_state
from shard_parity.runtime import checkpoint, tasks
from shard_parity import config as cfg
from shard_parity.step import bind, one_device_loss_and_grads
from shard_parity.tools.zoo import ep_swapped_axes

# One block, width 32, 16 positions: every layer kind, fast compiles. 'drops': capacity factor
# 1.0 (the even share: some experts overflow); 'all': factor E / K, capacity T, none dropped.
BASE = cfg.TransformerConfig(seq_len=16, num_layers=1, num_heads=4, num_kv_heads=4, embed_dim=32)


def moe_config(e, k, drops):
    return dataclasses.replace(
        BASE, num_experts=e, experts_per_token=k, capacity_factor=1.0 if drops else e / k
    )


TWINS = {'auto': auto, 'explicit': explicit, 'typed': typed}
# (twin, E, K, drops, mesh): every twin runs both settings, which between them take E = 4 and
# 8, K = 2 and 1, with drops and without, on the meshes 2x4, 4x2 and 1x8.
FAST = [('explicit', 4, 2, True, (2, 4))]  # the fast tier's one case
SLOW = [
    ('auto', 4, 2, True, (2, 4)),
    ('typed', 4, 2, True, (2, 4)),
    ('explicit', 8, 1, False, (4, 2)),
    ('auto', 8, 1, False, (2, 4)),
    ('typed', 8, 1, False, (1, 8)),
]
GRID = [pytest.param(*c, marks=[] if c in FAST else [pytest.mark.slow]) for c in FAST + SLOW]
IDS = [f'{t}-E{e}-K{k}-{"drops" if d else "all"}-{m[0]}x{m[1]}' for t, e, k, d, m in FAST + SLOW]


def ep_mesh(shape, twin=explicit):
    return make_mesh(shape=shape, axes=mesh_axes('ep'), axis_type=twin.AXIS_TYPE)  # data, expert


@pytest.fixture(scope='module')
def one_device():
    """(E, K, drops, steps?) -> the one-device run's (case, metrics, gradients) and, with
    steps, its 20 AdamW steps in float32 and float64: each computed once."""
    cache = {}

    def get(e, k, drops, steps=False):
        key = (e, k, drops)
        if key not in cache:
            case = make_case('transformer', moe_config(e, k, drops))
            graphdef, _, state = fresh_state(case=case)
            grads_fn = one_device_loss_and_grads(graphdef, case.loss_fn)
            cache[key] = (case, *grads_fn(state.params, case.batches.batch(0)))
        return (*cache[key], one_device_runs(cache[key][0])) if steps else cache[key]

    return get


def check_one_step(twin, mesh, case, want_metrics, want_grads, drops):
    graphdef, _, state = fresh_state(case=case)
    batch = case.batches.batch(0)
    metrics, grads = twin_loss_and_grads(twin, mesh, graphdef, case.loss_fn, state, batch, 'ep')
    assert (float(want_metrics['moe_dropped']) > 0) == drops  # the case is what it says
    for name in ('loss', 'moe_aux_loss', 'moe_dropped'):
        assert_close(metrics[name], want_metrics[name], name, **TOL)
    assert_trees_close(grads, want_grads, **TOL)
    return grads


@pytest.mark.parametrize('name, e, k, drops, shape', GRID, ids=IDS)
def test_ep_matches_the_one_device_run(name, e, k, drops, shape, one_device):
    """One step: the loss, the auxiliary loss, the dropped share and every gradient leaf; the
    experts' gradients come back split as their weights are."""
    case, want_metrics, want_grads = one_device(e, k, drops)
    mesh = ep_mesh(shape, TWINS[name])
    grads = check_one_step(TWINS[name], mesh, case, want_metrics, want_grads, drops)
    up = grads['blocks']['ffn']['experts']['up'][...]
    assert up.sharding.shard_shape(up.shape)[1] == e // shape[1]  # E/n experts per device


TRAINED = [pytest.param(t, marks=pytest.mark.slow) for t in ('explicit', 'auto')]


@pytest.mark.parametrize('name', TRAINED)
def test_20_steps_track_the_one_device_run(name, one_device):
    """20 AdamW steps with drops: the float32 losses per step, and every loss and parameter in
    float64 (helpers.py's error model)."""
    case, _, _, (want_32, want_64) = one_device(4, 2, True, steps=True)
    mesh = ep_mesh((2, 4), TWINS[name])
    losses, _ = train_twin(TWINS[name], mesh, case, strategy='ep')
    assert_close(losses, want_32[0], 'float32 losses', **LOSS_TOL)
    losses, params = train_twin_x64(TWINS[name], mesh, case, strategy='ep')
    assert_close(losses, want_64[0], 'float64 losses', **X64_TOL)
    assert_params_close(params, want_64[1], **X64_TOL)


@pytest.mark.slow
def test_all_to_alls_over_the_wrong_axis_are_caught(one_device):
    """The comparison can fail: the zoo's ep_swapped_axes sends each expert's slots over 'data'
    where 'expert' belongs; on a square mesh every shape still fits, but the tokens reach
    devices that hold other experts."""
    case, want_metrics, want_grads = one_device(4, 2, True)
    graphdef, _, state = fresh_state(case=case)
    batch = case.batches.batch(0)
    mesh = ep_mesh((2, 2))
    fn = ep_swapped_axes.loss_and_grads(graphdef, case.loss_fn, mesh, plan_of(mesh, ep_swapped_axes.STRATEGY))
    placed = place_state(state, mesh, plan_of(mesh, 'ep')).params
    got, grads = fn(placed, place_batch(batch, mesh, plan_of(mesh, 'dp')))
    assert_close(got['moe_aux_loss'], want_metrics['moe_aux_loss'], 'routing', **TOL)
    # at initialisation the experts add little to the residual stream (the loss moves by 4e-6
    # relative); their gradients show the wrong experts at once
    for name in ('up', 'down'):
        got_w = np.asarray(grads['blocks']['ffn']['experts'][name][...])
        want_w = np.asarray(want_grads['blocks']['ffn']['experts'][name][...])
        assert not np.allclose(got_w, want_w, **TOL), name


@pytest.mark.slow
def test_the_reference_loop_equals_the_batched_dispatch(one_device):
    """The one-device reference runs one expert at a time; the batched einsum path (what ep
    splits) on one device gives the same values and gradients."""
    case, want_metrics, want_grads = one_device(4, 2, True)
    graphdef, _, state = fresh_state(case=case)
    batched = bind(graphdef, case.loss_fn, experts=lambda xe, experts: experts(xe))
    (_, metrics), grads = jax.jit(jax.value_and_grad(batched, has_aux=True))(
        state.params, case.batches.batch(0)
    )
    assert_trees_close(metrics, want_metrics, **TOL)
    assert_trees_close(grads, want_grads, **TOL)


def test_capacity_and_the_drop_order():
    """Capacity is ceil(factor T K / E) per sequence; a token's first choice is served before
    any second choice, then by position."""
    c = moe_config(4, 2, True)
    assert moe.capacity(c, 16) == 8 and moe.capacity(moe_config(4, 2, False), 16) == 16
    # tokens 0 and 1 prefer expert 1, then 0; tokens 2 and 3 expert 0, then 1 (router below)
    x = np.array([[[0, 1], [0, 1], [1, 0], [1, 0]]], np.float32)  # [B=1, T=4, C=2]
    router = np.array([[2.0, 1.0, 0.0], [1.0, 2.0, 0.0]], np.float32)  # [C, E=3]
    r = moe.route(x, router, 2, cap=2)
    kept = np.asarray(r.dispatch[0].sum(-1))  # [T, E]
    # each of experts 0 and 1 fills its 2 slots with first choices; the second choices of the
    # earlier tokens 0 and 1 come after them in the queue, and are dropped
    assert kept.tolist() == [[0, 1, 0], [0, 1, 0], [1, 0, 0], [1, 0, 0]]
    assert float(r.dropped) == 0.5


def check_ep(config, mesh):  # the train CLI's checks of an ep run, batch 16
    checks.check(plan_of(mesh, 'ep'), config, 16)


def test_bad_expert_settings_are_refused():
    with pytest.raises(Exception, match=r"--num_experts=6 is not divisible by the mesh's expert"):
        check_ep(moe_config(6, 1, True), ep_mesh((2, 4)))
    with pytest.raises(Exception, match='--strategy=ep splits the experts'):
        check_ep(BASE, ep_mesh((2, 4)))
    with pytest.raises(Exception, match='--experts_per_token=5 must be between 1 and'):
        moe_config(4, 5, True)
    with pytest.raises(Exception, match='--capacity_factor=0 must be above 0'):
        dataclasses.replace(BASE, num_experts=4, capacity_factor=0)


@pytest.mark.slow  # compiles four programs
@pytest.mark.pinned
def test_inspector_pins_the_ep_collectives():
    """Every twin: per MoE layer two all-to-alls over 'expert' forward and two backward, each
    moving the device's slots f32[E, B/(d n), cap, C] (the inspector's expectation); the
    experts' gradients all-reduced over 'data' alone, the rest over all 8 devices (typed's on
    jax 0.12.1 over each axis in turn: helpers.REDUCES_PER_AXIS); no all-gather of an expert
    weight. The one-device run has no collective."""
    shape = {**dataclasses.asdict(moe_config(4, 2, True)), 'seq_len': 32, 'num_layers': 2}
    r = inspect_collectives('transformer', 'ep', (2, 4), batch_size=8, **shape)
    a2a = r['expected']['all_to_all']
    assert a2a['shape'] == [4, 1, 16, 32] and a2a['bytes_each'] == 8_192 and a2a['count'] == 8
    experts = r['expected']['expert_gradient_bytes']
    assert experts == 2 * 2 * (32 * 128 * 4)  # up and down of 2 layers, one expert each
    for twin in ('auto', 'explicit', 'typed'):
        ops = r['programs'][twin]
        moves = [op for op in ops if op['kind'] == 'all-to-all']
        assert [op['bytes'] for op in moves] == [a2a['bytes_each']] * a2a['count'], twin
        assert {op['group_size'] for op in moves} == {4}, twin
        phases = [op['phase'] for op in moves]
        assert phases.count('forward') == phases.count('backward') == 4, twin
        data_only = [op for op in ops if op['kind'] == 'all-reduce' and op['axes'] == ['data']]
        # jax 0.12.1: typed's rest (70,656 B) over 'data' alone too, then over 'expert'
        rest = [70_656] if twin == 'typed' and REDUCES_PER_AXIS else []
        assert [op['bytes'] for op in data_only] == [experts, *rest], twin
        gathers = [s for s in r['surprises'][twin] if s['kind'] == 'whole-weight-gather']
        assert not [s for s in gathers if "['experts']" in s['what']], twin
    assert r['programs']['one_device'] == []


MOVES = {'dp-to-ep': ('dp', (8, 1), 'ep', (2, 4)), 'ep-to-dp': ('ep', (4, 2), 'dp', (8, 1))}


@pytest.mark.slow
@pytest.mark.parametrize('saved_as, saved_on, restored_as, shape', MOVES.values(), ids=MOVES)
def test_checkpoints_move_between_dp_and_ep(saved_as, saved_on, restored_as, shape, tmp_path):
    config = moe_config(4, 2, True)
    case = make_case('transformer', config)
    graphdef, _, state = fresh_state(case=case)
    on = make_mesh(shape=saved_on, axes=mesh_axes(saved_as))
    state = place_state(state, on, plan_of(on, saved_as))
    save_checkpoint(tmp_path, state, case, config)
    tokens = case.batches.batch(0)['x']
    one = jax.devices()[0]  # logits on one device: both sides run the very same program
    before = logits(graphdef, state.params, tokens, one)
    mesh = make_mesh(shape=shape, axes=mesh_axes(restored_as))
    _, graphdef2, restored = checkpoint.restore(tmp_path, mesh, plan_of(mesh, restored_as))
    up = restored.params['blocks']['ffn']['experts']['up'][...]
    saved_up = state.params['blocks']['ffn']['experts']['up'][...]
    assert up.sharding.spec != saved_up.sharding.spec  # split over 'expert' on one side only
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(logits(graphdef2, restored.params, tokens, one), before)


@pytest.mark.slow
def test_cli_trains_with_ep_and_logs_the_experts(tmp_path):
    """The issue's command, short: the metrics carry the auxiliary loss and the dropped share."""
    flags = ['--model=transformer', '--strategy=ep', '--mesh=2x4', '--cpu_devices=8']
    moe_flags = ['--num_experts=4', '--experts_per_token=2', '--capacity_factor=1.25']
    shape = ['--num_layers=1', '--seq_len=32', '--batch_size=8', '--log_every=1']
    result = run_cli('explicit', *flags, *moe_flags, *shape, '--steps=3', f'--workdir={tmp_path}')
    assert result.returncode == 0, result.stderr[-2000:]
    lines = read_metrics(tmp_path)
    assert lines[-1]['final'] and lines[-1]['step'] == 3
    assert {'train_moe_aux_loss', 'train_moe_dropped'} <= set(lines[0])
    assert 0 <= lines[0]['train_moe_dropped'] < 1


def test_the_dense_model_logs_no_expert_metrics():
    """--num_experts=0: the feed-forward network as it was, and the loss's metrics as they were
    (traced only: jax.eval_shape compiles nothing)."""
    case = make_case('transformer', BASE)
    graphdef, _, state = fresh_state(case=case)
    metrics, grads = jax.eval_shape(
        one_device_loss_and_grads(graphdef, tasks.lm_loss), state.params, case.batches.batch(0)
    )
    assert set(metrics) == {'loss'} and set(grads['blocks']['ffn']) == {'up', 'down'}
    moe_case = make_case('transformer', moe_config(4, 2, True))
    graphdef, _, state = fresh_state(case=moe_case)
    metrics, _ = jax.eval_shape(
        one_device_loss_and_grads(graphdef, tasks.lm_loss), state.params, case.batches.batch(0)
    )
    assert set(metrics) == {'loss', 'moe_aux_loss', 'moe_dropped'}
