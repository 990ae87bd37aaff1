"""Claim: context parallelism (--strategy=cp) splits each sequence over the mesh's 'seq' axis and
gives the one-device run's loss and every gradient leaf, and 20 AdamW steps track it, in all
three twins, on 2x4, 4x2 and 1x8, MHA and GQA, in the zigzag and the contiguous layout; the
ring fails if it turns the wrong way or drops the causal mask; explicit's compiled step holds
the ring's collective-permutes beside one gradient all-reduce; checkpoints move between dp and
cp with bitwise logits; the train CLIs run it and its checkpoint generates on one device. Its
memory: parity_tests/test_cp_memory.py."""

import dataclasses
import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from parity_tests.helpers import (
    tier,
    LOSS_TOL,
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
from shard_parity.mesh import SEQ, make_mesh
from shard_parity.model import ring as ring_module
from shard_parity import checks
from shard_parity.placement import mesh_axes, place_batch, place_state
from shard_parity.runtime import checkpoint, tasks
from shard_parity import config as cfg
from shard_parity.step import bind, one_device_loss_and_grads

# 16 positions: 2 per device on a sequence axis of 8. One block: every layer kind, fast compiles.
MHA = cfg.TransformerConfig(seq_len=16, num_layers=1, num_heads=4, num_kv_heads=4, embed_dim=32)
GQA = dataclasses.replace(MHA, num_kv_heads=2)
CONFIGS = {'mha': MHA, 'gqa': GQA}
TWINS = {'auto': auto, 'explicit': explicit, 'typed': typed}
FAST = [('explicit', 'gqa', (2, 4))]
SHAPES = {'auto': [(2, 4), (4, 2), (1, 8)], 'explicit': [(2, 4), (4, 2), (1, 8)]}
SHAPES['typed'] = [(2, 4), (1, 8)]
GRID = [(t, m, s) for t in TWINS for m in CONFIGS for s in SHAPES[t]]
# every twin and model on 2x4 in the suite, and explicit's other shapes with MHA; the rest in
# the exhaustive tier
SUITE = {(t, m, s) for t, m, s in GRID if s == (2, 4) or (t, m) == ('explicit', 'mha')}
CASES = [pytest.param(*c, marks=tier(c in FAST, c not in SUITE)) for c in GRID]


def cp_mesh(shape, twin=explicit):
    return make_mesh(shape=shape, axes=mesh_axes('cp'), axis_type=twin.AXIS_TYPE)  # data, seq


@pytest.fixture(scope='module')
def one_device():
    """(config name, steps?) -> the one-device run's (case, metrics, gradients) and, with steps,
    its 20 AdamW steps in float32 and in float64 too: each computed once, and the steps only
    for the tests that train."""
    cache = {}

    def get(name, steps=False):
        if name not in cache:
            case = make_case('transformer', CONFIGS[name])
            graphdef, _, state = fresh_state(case=case)
            grads_fn = one_device_loss_and_grads(graphdef, case.loss_fn)
            cache[name] = (case, *grads_fn(state.params, case.batches.batch(0)))
        return (*cache[name], one_device_runs(cache[name][0])) if steps else cache[name]

    return get


def explicit_loss(one_device, name='gqa', shape=(2, 4)):
    case, want, _ = one_device(name)
    graphdef, _, state = fresh_state(case=case)
    batch = case.batches.batch(0)
    got, _ = twin_loss_and_grads(
        explicit, cp_mesh(shape), graphdef, case.loss_fn, state, batch, 'cp'
    )
    return float(got['loss']), float(want['loss'])


def test_the_ring_turning_the_wrong_way_is_caught(one_device, monkeypatch):
    """The comparison can fail: passing each block to the previous device instead of the next
    leaves every device attending to the chunk it thinks it holds, but not the one it has."""

    def backwards(kv):
        n = jax.lax.axis_size(SEQ)
        return jax.lax.ppermute(kv, SEQ, [(i, (i - 1) % n) for i in range(n)])

    monkeypatch.setattr(explicit.cp, 'pass_on', backwards)
    got, want = explicit_loss(one_device)
    assert not np.isclose(got, want, **TOL), (got, want)


def test_a_missing_causal_mask_is_caught(one_device, monkeypatch):
    """...and so can the mask: without it, queries see the later keys of their own chunks."""
    monkeypatch.setattr(ring_module, 'visible', lambda q, k: jnp.ones((q.size, k.size), bool))
    got, want = explicit_loss(one_device)
    assert not np.isclose(got, want, **TOL), (got, want)


@pytest.mark.parametrize(
    'name, model, shape', CASES, ids=[f'{t}-{m}-{d}x{n}' for t, m, (d, n) in GRID]
)
def test_cp_matches_the_one_device_run(name, model, shape, one_device):
    """One step in float32; 20 steps by the float32 losses, and every loss and parameter in
    float64 (helpers.py's error model)."""
    case, want_metrics, want_grads, (want_32, want_64) = one_device(model, steps=True)
    twin = TWINS[name]
    mesh = cp_mesh(shape, twin)
    graphdef, _, state = fresh_state(case=case)
    batch = case.batches.batch(0)
    metrics, grads = twin_loss_and_grads(twin, mesh, graphdef, case.loss_fn, state, batch, 'cp')
    assert_close(metrics['loss'], want_metrics['loss'], 'loss', **TOL)
    assert_trees_close(grads, want_grads, **TOL)

    losses, _ = train_twin(twin, mesh, case, strategy='cp')
    assert_close(losses, want_32[0], 'float32 losses', **LOSS_TOL)
    losses, params = train_twin_x64(twin, mesh, case, strategy='cp')
    assert_close(losses, want_64[0], 'float64 losses', **X64_TOL)
    assert_params_close(params, want_64[1], **X64_TOL)


LAYOUTS = [(t, m) for t in ('explicit', 'typed') for m in CONFIGS]


@pytest.mark.slow
@pytest.mark.parametrize('name, model', LAYOUTS, ids=[f'{t}-{m}' for t, m in LAYOUTS])
def test_the_contiguous_layout_matches_the_one_device_run(name, model, one_device):
    """--cp_layout=contiguous (the grid above runs the default, zigzag): loss and gradients."""
    case, want_metrics, want_grads = one_device(model)
    twin = TWINS[name]
    mesh = cp_mesh((2, 4), twin)
    graphdef, _, state = fresh_state(case=case)
    fn = twin.cp.loss_and_grads(
        graphdef, case.loss_fn, mesh, plan_of(mesh, 'cp', layout='contiguous')
    )
    placed = place_state(jax.tree.map(np.array, state), mesh, plan_of(mesh, 'cp'))
    metrics, grads = fn(
        placed.params, place_batch(case.batches.batch(0), mesh, plan_of(mesh, 'dp'))
    )
    assert_close(metrics['loss'], want_metrics['loss'], 'loss', **TOL)
    assert_trees_close(grads, want_grads, **TOL)


def test_the_zigzag_layout_gives_each_device_chunks_i_and_2n_minus_1_minus_i():
    assert ring_module.order(16, 4, 'zigzag').tolist() == [
        0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9
    ]  # fmt: skip
    assert ring_module.order(16, 4, 'contiguous').tolist() == list(range(16))
    batch = {'x': np.arange(32).reshape(2, 16)}
    assert ring_module.reorder(batch, 4, 'zigzag')['x'][1, :4].tolist() == [16, 17, 30, 31]


EVAL = [pytest.param(t, marks=[pytest.mark.slow] if t == 'typed' else []) for t in TWINS]


@pytest.mark.parametrize('name', EVAL)
def test_cp_evaluates_each_sequence_as_one_device_does(name, one_device):
    """Each device's per-sequence mean over its positions, averaged over 'seq': the whole
    mean (equal parts, whatever the layout)."""
    case, _, _ = one_device('gqa')
    graphdef, _, state = fresh_state(case=case)
    batch, mesh = case.batches.batch(0), cp_mesh((2, 4), TWINS[name])
    want = jax.jit(bind(graphdef, tasks.lm_eval))(state.params, batch)
    evaluate = TWINS[name].cp.eval_step(
        graphdef, tasks.lm_eval, mesh, plan_of(mesh, TWINS[name].cp.STRATEGY)
    )
    got = evaluate(
        place_state(state, mesh, plan_of(mesh, 'cp')).params,
        place_batch(batch, mesh, plan_of(mesh, 'dp')),
    )
    assert_trees_close(got, want, **TOL)


@pytest.mark.slow  # compiles four programs
@pytest.mark.pinned
def test_inspector_pins_the_cp_collectives():
    """explicit: per attention layer 8 collective-permutes of one f32[B/d, T/n, K, D] block each
    (keys, values and their gradients, in the ring's loops: 6n - 4 run), and the one gradient
    all-reduce over all 8 devices. auto: no ring; what XLA chose instead (jax 0.10.2, CPU):
    all-gathers over 'seq' and many more all-reduces."""
    shape = {'seq_len': 32, 'num_layers': 1, 'num_heads': 4, 'num_kv_heads': 2, 'embed_dim': 32}
    r = inspect_collectives('transformer', 'cp', (2, 4), batch_size=8, **shape)
    ring, grads = r['expected']['ring'], r['expected']['gradient_bytes']
    assert ring['shape'] == [4, 8, 2, 8] and ring['bytes_each'] == 2_048
    assert ring['per_layer'] == 8 and ring['count'] == 8 and ring['runs_per_layer'] == 20
    assert ring['bytes'] == 20 * 2_048
    ops = r['programs']['explicit']
    permutes = [op for op in ops if op['kind'] == 'collective-permute']
    assert [op['shapes'] for op in permutes] == [[list(ring['shape'])]] * ring['count']
    assert {op['group_size'] for op in permutes} == {8}  # 2 rings of 4: 8 source->target pairs
    (reduce,) = [op for op in ops if op['kind'] == 'all-reduce']
    assert reduce['group_size'] == 8 and reduce['bytes'] == grads + 4  # + the mean loss
    auto_kinds = {op['kind'] for op in r['programs']['auto']}
    assert 'collective-permute' not in auto_kinds and 'all-gather' in auto_kinds
    assert r['programs']['one_device'] == []


def check_cp(config, mesh, layout='zigzag'):  # the train CLI's checks of a cp run, batch 16
    checks.check(plan_of(mesh, 'cp', layout=layout), config, 16)


def test_a_sequence_axis_of_1_warns_and_bad_inputs_are_refused(caplog):
    with caplog.at_level(logging.WARNING):
        check_cp(MHA, cp_mesh((8, 1)))
    assert 'splits no sequence' in caplog.text
    with pytest.raises(Exception, match="--seq_len=30 is not divisible by the mesh's sequence"):
        check_cp(dataclasses.replace(MHA, seq_len=30), cp_mesh((2, 4)))
    with pytest.raises(Exception, match='--model=mlp has none'):
        check_cp(cfg.MLPConfig(), cp_mesh((2, 4)))
    zigzag = dataclasses.replace(MHA, seq_len=36)  # divisible by 4, not by 2 x 4 chunks
    with pytest.raises(Exception, match=r'--seq_len=36 is not divisible by 2 x the sequence'):
        check_cp(zigzag, cp_mesh((2, 4)))
    check_cp(zigzag, cp_mesh((2, 4)), 'contiguous')  # one chunk each: 36 / 4


MOVES = {'dp-to-cp': ('dp', (8, 1), 'cp', (2, 4)), 'cp-to-dp': ('cp', (1, 8), 'dp', (4, 2))}


@pytest.mark.parametrize('saved_as, saved_on, restored_as, shape', MOVES.values(), ids=MOVES)
def test_checkpoints_move_between_dp_and_cp(saved_as, saved_on, restored_as, shape, tmp_path):
    case = make_case('transformer', GQA)
    graphdef, _, state = fresh_state(case=case)
    on = make_mesh(shape=saved_on, axes=mesh_axes(saved_as))
    state = place_state(state, on, plan_of(on, saved_as))
    save_checkpoint(tmp_path, state, case, GQA)
    tokens = case.batches.batch(0)['x']
    one = jax.devices()[0]  # logits on one device: both sides run the very same program
    before = logits(graphdef, state.params, tokens, one)
    mesh = make_mesh(shape=shape, axes=mesh_axes(restored_as))
    _, graphdef2, restored = checkpoint.restore(tmp_path, mesh, plan_of(mesh, restored_as))
    query = restored.params['blocks']['attn']['query']['kernel'][...]
    saved_query = state.params['blocks']['attn']['query']['kernel'][...]
    assert query.sharding.mesh.axis_names == mesh_axes(restored_as)  # on restored_as's mesh
    assert saved_query.sharding.mesh.axis_names != query.sharding.mesh.axis_names  # not saved's
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(logits(graphdef2, restored.params, tokens, one), before)


@pytest.mark.slow
def test_cli_trains_with_cp_and_its_checkpoint_generates(tmp_path):
    """The issue's command (with a warm-up that fits 20 steps), then generation: it restores
    the replicated state onto one device, whatever mesh trained it."""
    workdir = f'--workdir={tmp_path}'
    flags = ['--model=transformer', '--strategy=cp', '--mesh=2x4', '--cpu_devices=8']
    result = run_cli('explicit', *flags, '--steps=20', '--warmup_steps=2', workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = read_metrics(tmp_path)
    assert lines[-1]['final'] and lines[-1]['step'] == 20
    assert lines[-1]['eval_loss'] < lines[0]['train_loss']
    for twin in TWINS:
        out = run_cli(twin, workdir, '--max_new_bytes=20', '--cpu_devices=1', program='generate')
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip()


@pytest.mark.slow
def test_typed_cli_trains_with_cp_and_records_its_layout(tmp_path):
    """typed.train offers --strategy=cp and runs it (issue 23, item 7), here in the contiguous
    layout, which config.json records."""
    flags = ['--model=transformer', '--strategy=cp', '--mesh=2x4', '--cpu_devices=8']
    shape = ['--num_layers=1', '--seq_len=32', '--batch_size=8', '--cp_layout=contiguous']
    result = run_cli('typed', *flags, *shape, '--steps=2', f'--workdir={tmp_path}')
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_metrics(tmp_path)[-1]['step'] == 2
    assert json.loads((tmp_path / 'config.json').read_text())['cp_layout'] == 'contiguous'
