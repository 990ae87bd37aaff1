"""Claim: tensor parallelism (--strategy=tp, fsdp_tp) splits each layer Megatron's way over the
mesh's 'model' axis, so that per-device state falls as 1/(model) for the split layers and
1/(fsdp x model) under fsdp_tp; the explicit twin's only forward collective is the psum after
each row-parallel layer, and auto's compiler finds the same all-reduces; checkpoints move
between dp, fsdp, tp and fsdp_tp with unchanged logits; the train CLIs run it on a 2-D mesh."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from parity_tests.helpers import (
    CLI_MODELS,
    TP_TRANSFORMER,
    device0_bytes,
    fresh_state,
    inspect_collectives,
    logits,
    make_case,
    plan_of,
    read_metrics,
    run_cli,
    save_checkpoint,
    strategy_mesh,
)
from shard_parity.mesh import FSDP, MODEL
from shard_parity.placement import place_state
from shard_parity.runtime import checkpoint


def test_tp_gives_each_model_device_whole_heads():
    case = make_case('transformer', TP_TRANSFORMER)  # 8 heads of 4 dims, width 32
    _, _, state = fresh_state(case=case)
    mesh = strategy_mesh('tp', (4, 2))
    placed = place_state(state, mesh, plan_of(mesh, 'tp'))
    attn = placed.params['blocks']['attn']  # stacked: [L, in, out], L = 1, never split
    shard = lambda x: x.addressable_shards[0].data.shape  # noqa: E731
    assert shard(attn['query']['kernel'][...]) == (1, 32, 16)  # column-parallel: 4 of 8 heads
    assert shard(attn['key_value']['kernel'][...]) == (1, 32, 32)  # [k|v] of the same 4 heads
    assert shard(attn['out']['kernel'][...]) == (1, 16, 32)  # row-parallel: their 16 features
    ffn = placed.params['blocks']['ffn']
    assert shard(ffn['up']['kernel'][...]) == (1, 32, 64)
    assert shard(ffn['down']['kernel'][...]) == (1, 64, 32)
    assert shard(placed.params['embed']['embedding'][...]) == (256, 32)  # whole: not split


@pytest.mark.parametrize('model', ['mlp', 'transformer'])
def test_state_per_device_falls_with_each_axis(model):
    """Bytes of params + optimizer state on device 0, read from the arrays' shardings."""
    case = make_case('mlp') if model == 'mlp' else make_case('transformer', TP_TRANSFORMER)
    _, _, state = fresh_state(case=case)
    total = sum(x.nbytes for x in jax.tree.leaves(state))
    held = {}
    for strategy, shape in [
        ('dp', (8, 1)),
        ('fsdp', (8, 1)),
        ('tp', (4, 2)),
        ('tp', (1, 8)),
        ('fsdp_tp', (4, 2)),
    ]:
        mesh = strategy_mesh(strategy, shape)
        placed = place_state(jax.tree.map(np.array, state), mesh, plan_of(mesh, strategy))
        held[strategy, shape] = device0_bytes(placed)
    assert held['dp', (8, 1)] == total
    assert held['fsdp', (8, 1)] < total / 7
    # tp splits only the matrices it pairs (not embeddings, norms, the MLP's head):
    assert total / 2 < held['tp', (4, 2)] < total
    assert held['tp', (1, 8)] < held['tp', (4, 2)]
    assert held['fsdp_tp', (4, 2)] < held['tp', (4, 2)] / 3  # and fsdp splits what is left 4 ways


@pytest.mark.pinned
@pytest.mark.parametrize('model', ['mlp', pytest.param('transformer', marks=pytest.mark.slow)])
def test_inspector_pins_the_tp_collectives(model):
    shape = {'num_layers': 2, 'num_heads': 4, 'num_kv_heads': 4} if model == 'transformer' else {}
    r = inspect_collectives(model, 'tp', (4, 2), batch_size=16, **shape)
    act, grads = r['expected']['activations'], r['expected']['gradient_bytes']
    assert act['count'] == (1 if model == 'mlp' else 5 * 2) and act['group_size'] == 2
    for twin in ('auto', 'explicit', 'typed'):
        ops = r['programs'][twin]
        assert {op['kind'] for op in ops} == {'all-reduce'}
        over_model = [s for op in ops if op['group_size'] == 2 for s in op['shapes']]
        assert sorted(s for s in over_model if s) == [list(act['shape'])] * act['count']
        over_data = sum(op['bytes'] for op in ops if op['group_size'] == 4)
        extra = 4 * (2 if model == 'mlp' else 1)  # the averaged metrics
        if twin == 'auto' and model == 'transformer':
            extra += 256 * 128 * 4  # the tied embedding's two terms, all-reduced apart (dp too)
        assert over_data == grads + extra, (twin, over_data, grads)


@pytest.mark.pinned
def test_inspector_pins_the_fsdp_tp_collectives():
    """explicit/: the all-gathers and reduce-scatters it writes; typed/: the same all-gathers,
    and its reshard of `unreduced` gradients to the split layout (a reduce-scatter in the
    types), which XLA:CPU compiles to one all-reduce of every gradient and a slice, as under
    fsdp (test_fsdp.py, docs/typed.md)."""
    r = inspect_collectives('mlp', 'fsdp_tp', (4, 2), batch_size=16)
    by_kind = {}
    for twin in ('explicit', 'typed'):
        for op in r['programs'][twin]:
            key = twin, op['kind'], op['group_size']
            by_kind[key] = by_kind.get(key, 0) + op['bytes']
    tp_slice = r['expected']['gradient_bytes']  # each device's tensor-parallel slice
    odd = (10 + 256) * 4  # the head's 10-wide bias, layer 1's bias: not split over 'fsdp'
    activations = r['expected']['activations']['bytes']
    assert by_kind == {
        ('explicit', 'all-gather', 4): tp_slice - odd,  # every fsdp-sharded slice, whole
        ('explicit', 'reduce-scatter', 4): (tp_slice - odd) // 4,
        ('explicit', 'all-reduce', 2): activations,
        ('explicit', 'all-reduce', 4): odd + 8,  # + the two metrics
        ('typed', 'all-gather', 4): tp_slice - odd,
        ('typed', 'all-reduce', 2): activations,
        ('typed', 'all-reduce', 4): tp_slice + 8,  # every gradient, + the two metrics
    }


# the stacked query kernel f32[L, C, C]: the layer dimension is never split
QUERY_SPEC = {
    'dp': P(),
    'fsdp': P(None, FSDP),
    'tp': P(None, None, MODEL),
    'fsdp_tp': P(None, FSDP, MODEL),
}
MOVES = {  # saved under, restored under, onto the mesh
    'dp-to-fsdp': ('dp', 'fsdp', (8, 1)),
    'fsdp-to-dp': ('fsdp', 'dp', (8, 1)),
    'dp-to-tp': ('dp', 'tp', (4, 2)),
    'tp-to-fsdp_tp': ('tp', 'fsdp_tp', (2, 4)),
    'fsdp-to-tp': ('fsdp', 'tp', (1, 8)),
}


@pytest.mark.parametrize('saved_as, restored_as, shape', MOVES.values(), ids=MOVES.keys())
def test_checkpoints_move_between_strategies(saved_as, restored_as, shape, tmp_path):
    case = make_case('transformer', TP_TRANSFORMER)
    graphdef, _, state = fresh_state(case=case)
    on = strategy_mesh(saved_as, (4, 2))
    state = place_state(state, on, plan_of(on, saved_as))
    save_checkpoint(tmp_path, state, case, TP_TRANSFORMER)
    tokens = case.batches.batch(0)['x']
    one = jax.devices()[0]  # logits on one device: both sides run the very same program
    before = logits(graphdef, state.params, tokens, one)
    mesh = strategy_mesh(restored_as, shape)
    _, graphdef2, restored = checkpoint.restore(tmp_path, mesh, plan_of(mesh, restored_as))
    query = restored.params['blocks']['attn']['query']['kernel'][...]
    assert query.sharding.spec == QUERY_SPEC[restored_as]  # placed as restored_as places it
    saved_query = state.params['blocks']['attn']['query']['kernel'][...]
    assert saved_query.sharding.spec != query.sharding.spec  # ...which is not how it was saved
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(logits(graphdef2, restored.params, tokens, one), before)


@pytest.mark.slow
def test_cli_trains_with_tp_on_a_2d_mesh_and_resumes_under_fsdp_tp(tmp_path):
    flags = [
        *CLI_MODELS['transformer'],
        '--cpu_devices=8',
        '--decay_steps=40',
        '--log_every=10',
        '--eval_every=20',
        f'--workdir={tmp_path}',
    ]
    first = run_cli('explicit', *flags, '--strategy=tp', '--mesh=4x2', '--steps=20')
    assert first.returncode == 0, first.stderr[-2000:]
    second = run_cli('auto', *flags, '--strategy=fsdp_tp', '--mesh=2x2', '--steps=40')
    assert second.returncode == 0, second.stderr[-2000:]
    assert 'resuming from' in second.stderr
    lines = read_metrics(tmp_path)
    assert lines[-1]['final'] and lines[-1]['step'] == 40
    assert [line['step'] for line in lines if 'train_loss' in line] == [10, 20, 30, 40]
    assert lines[-1]['eval_loss'] < lines[0]['train_loss']
