"""Claim: context parallelism (--strategy=cp) splits each sequence over the mesh's 'seq' axis and
gives the one-device run's loss and every gradient leaf, and 20 AdamW steps track it, in both
twins, on 2x4, 4x2 and 1x8, MHA and GQA; explicit's ring fails if it turns the wrong way or drops
the causal mask; its compiled step holds 4(n-1) collective-permutes per attention layer (K and V,
forward and backward) beside one gradient all-reduce; checkpoints move between dp and cp with
bitwise logits; the train CLI runs it and its checkpoint generates on one device."""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import auto
import explicit
from parity_tests.helpers import (
    LOSS_TOL,
    PARAM_TOL,
    TOL,
    assert_trees_close,
    fresh_state,
    inspect_collectives,
    logits,
    make_case,
    read_metrics,
    run_cli,
    save_checkpoint,
    train,
    train_twin,
    twin_loss_and_grads,
)
from shard_parity.mesh import SEQ, make_mesh
from shard_parity.model import attention
from shard_parity.placement import check_cp, mesh_axes, place_batch, place_state
from shard_parity.runtime import checkpoint, tasks
from shard_parity.runtime import config as cfg
from shard_parity.step import bind, one_device_loss_and_grads, one_device_train_step

# 16 positions: 2 per device on a sequence axis of 8. One block: every layer kind, fast compiles.
MHA = cfg.TransformerConfig(seq_len=16, num_layers=1, num_heads=4, num_kv_heads=4, embed_dim=32)
GQA = dataclasses.replace(MHA, num_kv_heads=2)
CONFIGS = {'mha': MHA, 'gqa': GQA}
TWINS = {'auto': auto, 'explicit': explicit}
FAST = [('explicit', 'gqa', (2, 4))]
GRID = [(t, m, s) for t in TWINS for m in CONFIGS for s in [(2, 4), (4, 2), (1, 8)]]
CASES = [pytest.param(*c, marks=[] if c in FAST else [pytest.mark.slow]) for c in GRID]


def cp_mesh(shape):
    return make_mesh(shape=shape, axes=mesh_axes('cp'))  # ('data', 'seq')


@pytest.fixture(scope='module')
def one_device():
    """(config name, steps?) -> the one-device run's (case, metrics, gradients) and, with steps,
    its 20 AdamW steps too: each computed once, and the steps only for the tests that train."""
    cache = {}

    def get(name, steps=False):
        if name not in cache:
            case = make_case('transformer', CONFIGS[name])
            graphdef, _, state = fresh_state(case=case)
            grads_fn = one_device_loss_and_grads(graphdef, case.loss_fn)
            cache[name] = (case, *grads_fn(state.params, case.batches.batch(0)))
        if steps and (name, 'steps') not in cache:
            case = cache[name][0]
            graphdef, tx, state = fresh_state(case=case)
            one = one_device_train_step(graphdef, case.loss_fn, tx)
            cache[name, 'steps'] = train(one, state, case.batches)
        return (*cache[name], cache[name, 'steps']) if steps else cache[name]

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
    """...and so can the mask: without it, queries see the later keys of their own chunk."""
    monkeypatch.setattr(attention, 'causal_mask', lambda t, s, *a, **k: jnp.ones((t, s), bool))
    got, want = explicit_loss(one_device)
    assert not np.isclose(got, want, **TOL), (got, want)


@pytest.mark.parametrize(
    'name, model, shape', CASES, ids=[f'{t}-{m}-{d}x{n}' for t, m, (d, n) in GRID]
)
def test_cp_matches_the_one_device_run(name, model, shape, one_device):
    case, want_metrics, want_grads, (want_losses, want_params) = one_device(model, steps=True)
    twin, mesh = TWINS[name], cp_mesh(shape)
    graphdef, _, state = fresh_state(case=case)
    batch = case.batches.batch(0)
    metrics, grads = twin_loss_and_grads(twin, mesh, graphdef, case.loss_fn, state, batch, 'cp')
    np.testing.assert_allclose(metrics['loss'], want_metrics['loss'], **TOL)
    assert_trees_close(grads, want_grads, **TOL)

    losses, params = train_twin(twin, mesh, case, strategy='cp')
    np.testing.assert_allclose(losses, want_losses, **LOSS_TOL)
    for p, r in zip(params, want_params, strict=True):
        np.testing.assert_allclose(p, r, **PARAM_TOL)


@pytest.mark.parametrize('name', list(TWINS))
def test_cp_evaluates_each_sequence_as_one_device_does(name, one_device):
    """Each device's per-sequence mean over its chunk, averaged over 'seq': the whole mean."""
    case, _, _ = one_device('gqa')
    graphdef, _, state = fresh_state(case=case)
    batch, mesh = case.batches.batch(0), cp_mesh((2, 4))
    want = jax.jit(bind(graphdef, tasks.lm_eval))(state.params, batch)
    evaluate = TWINS[name].cp.eval_step(graphdef, tasks.lm_eval, mesh)
    got = evaluate(place_state(state, mesh, 'cp').params, place_batch(batch, mesh))
    assert_trees_close(got, want, **TOL)


def test_inspector_pins_the_cp_collectives():
    """explicit: per attention layer 4(n-1) collective-permutes of one f32[B/d, T/n, K, D] key
    or value block each, and the one gradient all-reduce over all 8 devices. auto: no ring; what
    XLA chose instead (jax 0.10.2, CPU): all-gathers over 'seq' and many more all-reduces."""
    shape = {'seq_len': 32, 'num_layers': 1, 'num_heads': 4, 'num_kv_heads': 2, 'embed_dim': 32}
    r = inspect_collectives('transformer', 'cp', (2, 4), batch_size=8, **shape)
    ring, grads = r['expected']['ring'], r['expected']['gradient_bytes']
    assert ring['shape'] == [4, 8, 2, 8] and ring['bytes_each'] == 2_048
    assert ring['per_layer'] == 12 and ring['count'] == 12 and ring['bytes'] == 24_576
    ops = r['programs']['explicit']
    permutes = [op for op in ops if op['kind'] == 'collective-permute']
    assert [op['shapes'] for op in permutes] == [[list(ring['shape'])]] * ring['count']
    assert {op['group_size'] for op in permutes} == {8}  # 2 rings of 4: 8 source->target pairs
    (reduce,) = [op for op in ops if op['kind'] == 'all-reduce']
    assert reduce['group_size'] == 8 and reduce['bytes'] == grads + 4  # + the mean loss
    auto_kinds = {op['kind'] for op in r['programs']['auto']}
    assert 'collective-permute' not in auto_kinds and 'all-gather' in auto_kinds
    assert r['programs']['one_device'] == []


def test_a_sequence_axis_of_1_warns_and_bad_inputs_are_refused(caplog):
    with caplog.at_level(logging.WARNING):
        check_cp(MHA, cp_mesh((8, 1)))
    assert 'splits no sequence' in caplog.text
    with pytest.raises(Exception, match="--seq_len=30 is not divisible by the mesh's sequence"):
        check_cp(dataclasses.replace(MHA, seq_len=30), cp_mesh((2, 4)))
    with pytest.raises(Exception, match='--model=mlp has none'):
        check_cp(cfg.MLPConfig(), cp_mesh((2, 4)))


MOVES = {'dp-to-cp': ('dp', (8, 1), 'cp', (2, 4)), 'cp-to-dp': ('cp', (1, 8), 'dp', (4, 2))}


@pytest.mark.parametrize('saved_as, saved_on, restored_as, shape', MOVES.values(), ids=MOVES)
def test_checkpoints_move_between_dp_and_cp(saved_as, saved_on, restored_as, shape, tmp_path):
    case = make_case('transformer', GQA)
    graphdef, _, state = fresh_state(case=case)
    state = place_state(state, make_mesh(shape=saved_on, axes=mesh_axes(saved_as)), saved_as)
    save_checkpoint(tmp_path, state, case, GQA)
    tokens = case.batches.batch(0)['x']
    one = jax.devices()[0]  # logits on one device: both sides run the very same program
    before = logits(graphdef, state.params, tokens, one)
    mesh = make_mesh(shape=shape, axes=mesh_axes(restored_as))
    _, graphdef2, restored = checkpoint.restore(tmp_path, mesh, restored_as)
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
