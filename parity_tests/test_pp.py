"""Claim: pipeline parallelism (--strategy=pp) splits the transformer's stacked layers into S
stages over the mesh's 'stage' axis, runs M microbatches through them on the GPipe schedule,
and gives the one-device run's loss and every gradient leaf, and 20 AdamW steps track it, in all
three twins, for S = 2 and 4, M = S and 2S, MHA and GQA; a ppermute turned the wrong way is
caught (tools/zoo/pp_wrong_way.py); explicit's compiled step holds one collective-permute
per tick each way and no gathered weight; checkpoints move between dp and pp with bitwise
logits; the train CLI runs it. Bad input: shard_parity/plan.py's checks."""

import dataclasses
import logging

import jax
import numpy as np
import pytest

from parity_tests.helpers import (
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
)
from parity_tests.wide import one_device_runs, train_twin_x64
from shard_parity import auto, explicit, typed
from shard_parity.mesh import make_mesh
from shard_parity import checks
from shard_parity.placement import mesh_axes, place_batch, place_state
from shard_parity.runtime import checkpoint
from shard_parity import config as cfg
from shard_parity.step import one_device_loss_and_grads
from shard_parity.tools.bisect import divergence as D
from shard_parity.tools.zoo import pp_wrong_way

# 4 layers: 1 or 2 per stage. The blocks run under a scan, so more layers cost no compile time.
MHA = cfg.TransformerConfig(seq_len=16, num_layers=4, num_heads=4, num_kv_heads=4, embed_dim=32)
GQA = dataclasses.replace(MHA, num_kv_heads=2)
CONFIGS = {'mha': MHA, 'gqa': GQA, 'mha2': dataclasses.replace(MHA, num_layers=2)}
TWINS = {'auto': auto, 'explicit': explicit, 'typed': typed}
# (model, stages S, microbatches M): each of S = 2, 4 with M = S and 2S, MHA and GQA in turn.
SCHEDULES = [('gqa', 2, 2), ('mha', 2, 4), ('mha', 4, 4), ('gqa', 4, 8)]
FAST = [('explicit', 'gqa', 2, 2), ('typed', 'mha2', 1, 2)]
# No pipeline, S = 1: typed's vmap over a size-1 Explicit axis failed to differentiate 2 MHA
# layers (jax 0.10 and 0.12), so typed/pp.py runs the microbatches through the layers in turn.
GRID = [(t, *s) for t in TWINS for s in SCHEDULES] + [(t, 'mha2', 1, 2) for t in TWINS]
CASES = [pytest.param(*c, marks=[] if c in FAST else [pytest.mark.slow]) for c in GRID]


def pp_mesh(stages, twin=explicit):
    shape = (8 // stages, stages)
    return make_mesh(shape=shape, axes=mesh_axes('pp'), axis_type=twin.AXIS_TYPE)  # data, stage


@pytest.fixture(scope='module')
def one_device():
    """config name -> the one-device run's (case, metrics, gradients), computed once."""
    cache = {}

    def get(name):
        if name not in cache:
            case = make_case('transformer', CONFIGS[name])
            graphdef, _, state = fresh_state(case=case)
            grads_fn = one_device_loss_and_grads(graphdef, case.loss_fn)
            cache[name] = (case, *grads_fn(state.params, case.batches.batch(0)))
        return cache[name]

    return get


def pp_loss_and_grads(module, case, stages, microbatches, twin=explicit):
    mesh = pp_mesh(stages, twin)
    graphdef, _, state = fresh_state(case=case)
    plan = plan_of(mesh, 'pp', microbatches=microbatches)
    fn = module.loss_and_grads(graphdef, case.loss_fn, mesh, plan)
    placed = place_state(jax.tree.map(np.array, state), mesh, plan)
    return fn(placed.params, place_batch(case.batches.batch(0), mesh, plan))


@pytest.mark.parametrize(
    'name, model, stages, microbatches', CASES, ids=[f'{t}-{m}-S{s}-M{n}' for t, m, s, n in GRID]
)
def test_pp_matches_the_one_device_run(name, model, stages, microbatches, one_device):
    """One step in float32: the loss and every gradient leaf, the stages' layers included."""
    case, want_metrics, want_grads = one_device(model)
    twin = TWINS[name]
    metrics, grads = pp_loss_and_grads(twin.pp, case, stages, microbatches, twin)
    assert_close(metrics['loss'], want_metrics['loss'], 'loss', **TOL)
    assert_trees_close(grads, want_grads, **TOL)


@pytest.mark.slow
def test_the_ppermute_turning_the_wrong_way_is_caught(one_device):
    """The comparison can fail: handing each stage's output back to the previous stage leaves
    the last stage running on zeros (tools/zoo/pp_wrong_way.py)."""
    case, want, _ = one_device('gqa')
    got, _ = pp_loss_and_grads(pp_wrong_way, case, 2, 2)
    assert not np.isclose(float(got['loss']), float(want['loss']), **TOL), (got, want)


@pytest.fixture(scope='module')
def one_device_steps():
    """The one-device run's 20 AdamW steps of GQA, in float32 and in float64: computed once."""
    case = make_case('transformer', GQA)
    return (case, *one_device_runs(case))


@pytest.mark.slow
def test_the_bisector_finds_the_wrong_way_at_the_pipelines_output():
    """The bug zoo's pp_wrong_way against explicit: the last stage never receives a microbatch,
    so the pipeline's output, the final norm's input, is the blocks run on zeros: zeros. The
    blocks run inside the schedule, so the first module the bisector sees differ is `norm`."""
    case = make_case('transformer', GQA)
    graphdef, tx, state = fresh_state(case=case)
    mesh = pp_mesh(4)
    plan = plan_of(mesh, 'pp')
    sides = [D.load_side(n, plan, mesh) for n in ('explicit', 'tools.zoo.pp_wrong_way')]
    report = D.bisect(*sides, graphdef, case.loss_fn, tx, state, case.batches, 1)
    assert (report.step, report.phase, report.layer) == (0, 'forward', 'norm')
    assert report.ratio == 0.0


@pytest.mark.slow
@pytest.mark.parametrize('name', TWINS)
def test_20_steps_of_pp_track_the_one_device_run(name, one_device_steps):
    """20 AdamW steps on 2x4 (S = 4, M = 4): the float32 losses step by step, and every loss and
    parameter of the float64 rerun (helpers.py's error model)."""
    case, want_32, want_64 = one_device_steps
    twin, mesh = TWINS[name], pp_mesh(4, TWINS[name])
    losses, _ = train_twin(twin, mesh, case, strategy='pp')
    assert_close(losses, want_32[0], 'float32 losses', **LOSS_TOL)
    losses, params = train_twin_x64(twin, mesh, case, strategy='pp')
    assert_close(losses, want_64[0], 'float64 losses', **X64_TOL)
    assert_params_close(params, want_64[1], **X64_TOL)


def check_pp(config, mesh, batch_size, microbatches):  # the train CLI's checks of a pp run
    checks.check(plan_of(mesh, 'pp', microbatches=microbatches), config, batch_size)


def test_a_stage_axis_of_1_warns_and_bad_inputs_are_refused(caplog):
    with caplog.at_level(logging.WARNING):
        check_pp(MHA, pp_mesh(1), batch_size=16, microbatches=2)
    assert 'makes no pipeline' in caplog.text
    with pytest.raises(Exception, match="--num_layers=6 is not divisible by the mesh's stage"):
        check_pp(dataclasses.replace(MHA, num_layers=6), pp_mesh(4), 16, 2)
    with pytest.raises(Exception, match='--batch_size=12 does not split into --microbatches=4'):
        check_pp(MHA, pp_mesh(4), 12, 4)  # 6 rows per 'data' device
    check_pp(MHA, pp_mesh(4), 12, 3)  # 2 rows per microbatch
    with pytest.raises(Exception, match='--model=mlp has none'):
        check_pp(cfg.MLPConfig(), pp_mesh(4), 16, 2)


MOVES = {'dp-to-pp': ('dp', (8, 1), 'pp', (2, 4)), 'pp-to-dp': ('pp', (2, 4), 'dp', (4, 2))}


@pytest.mark.slow
@pytest.mark.parametrize('saved_as, saved_on, restored_as, shape', MOVES.values(), ids=MOVES)
def test_checkpoints_move_between_dp_and_pp(saved_as, saved_on, restored_as, shape, tmp_path):
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
    assert saved_query.sharding.spec != query.sharding.spec  # split over 'stage' on one side
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(logits(graphdef2, restored.params, tokens, one), before)


@pytest.mark.slow
def test_cli_trains_with_pp(tmp_path):
    """The train CLI on 2x4 with 4 microbatches: --microbatches reaches the step, and
    config.json records it."""
    flags = ['--model=transformer', '--strategy=pp', '--mesh=2x4', '--microbatches=4']
    shape = ['--num_layers=4', '--seq_len=16', '--embed_dim=32', '--batch_size=16']
    result = run_cli(
        'auto', *flags, *shape, '--steps=1', '--cpu_devices=8', f'--workdir={tmp_path}'
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_metrics(tmp_path)[-1]['step'] == 1
    assert '"microbatches": 4' in (tmp_path / 'config.json').read_text()


@pytest.mark.slow  # compiles four programs
@pytest.mark.pinned
def test_inspector_pins_the_pp_collectives():
    """explicit: two collective-permutes of one microbatch's activations f32[B/dM, T, C], the
    forward's (stage i -> i + 1) and the backward's (i + 1 -> i), each run M + S - 1 times;
    the outputs' all-reduce over 'stage' once each way; the gradient all-reduce over 'data' of
    each device's share. No twin gathers a stage's weights. auto: the compiler's collective-
    permutes (jax 0.10.2, CPU: beside all-to-alls, docs/pipeline.md). auto and typed reduce
    nothing over 'stage' inside the loop: stage 0's input gradient is reduced once after it."""
    shape = {'seq_len': 16, 'num_layers': 4, 'num_heads': 4, 'num_kv_heads': 2, 'embed_dim': 32}
    r = inspect_collectives('transformer', 'pp', (2, 4), batch_size=16, **shape)
    stages, grads = r['expected']['stages'], r['expected']['gradient_bytes']
    assert stages['shape'] == [2, 16, 32] and stages['bytes_each'] == 2 * 16 * 32 * 4
    assert stages['ticks'] == 4 + 4 - 1 and stages['bytes'] == 2 * 7 * 4_096
    ops = r['programs']['explicit']
    permutes = [op for op in ops if op['kind'] == 'collective-permute']
    assert [op['shapes'] for op in permutes] == [[list(stages['shape'])]] * stages['count']
    assert [op['trip_count'] for op in permutes] == [stages['ticks']] * 2
    assert {op['group_size'] for op in permutes} == {6}  # 2 pipelines of 4: 3 pairs each
    assert sum(op['bytes'] * op['trip_count'] for op in permutes) == stages['bytes']
    reduces = [op for op in ops if op['kind'] == 'all-reduce']
    assert all(op['trip_count'] == 1 for op in reduces)  # none inside the ticks' loops
    over_data = [op for op in reduces if op['group_size'] == 2]
    assert sum(op['bytes'] for op in over_data) == grads + 4  # + the mean loss
    for twin in ('auto', 'explicit', 'typed'):
        kinds = {op['kind'] for op in r['programs'][twin]}
        assert 'all-gather' not in kinds and 'collective-permute' in kinds, (twin, kinds)
    for twin in ('auto', 'typed'):  # per tick, nothing over 'stage' is summed (feed_slots); the
        # blocks' gradients are, over 'data' (typed: a JAX bug, docs/pipeline.md; auto: XLA's)
        looped = [op for op in r['programs'][twin] if op['kind'] == 'all-reduce']
        assert {op['group_size'] for op in looped if op['trip_count'] > 1} == {2}, (twin, looped)
    assert r['programs']['one_device'] == []
