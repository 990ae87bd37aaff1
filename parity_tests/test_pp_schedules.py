"""Claim: the pipeline schedules beyond GPipe (--pp_schedule=1f1b|interleaved, <twin>/pp_1f1b.py
in all three twins) give the one-device run's loss and every gradient leaf, and 20 AdamW steps
track it, on S = 2 and 4 stages, M = S and 2S microbatches, V = 2 virtual stages, MHA and GQA;
their table (shard_parity/pipeline.py's `one_f_one_b`) hands every unit its input one tick
before it runs and never overwrites a saved input before its backward; a backward run on
another microbatch's saved input is caught (tools/zoo/pp_1f1b_wrong_slot.py), and the bisector
finds it in the gradients; 1F1B's temporary memory does not grow with M, GPipe's does; the
bubble in the compiled FLOPs is (S - 1)/(VM + S - 1); checkpoints move between the schedules
with bitwise logits; the train CLI runs them. Bad input: test_bad_inputs.py's --pp_schedule and
--pp_virtual rows."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

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
)
from parity_tests.wide import one_device_runs
from parity_tests.helpers import train_twin
from parity_tests.wide import train_twin_x64
from shard_parity import auto, explicit, typed
from shard_parity.memory import abstract_state
from shard_parity.mesh import make_mesh
from shard_parity.model.transformer import Transformer
from shard_parity.pipeline import pieces, rest_of
from shard_parity.schedules import one_f_one_b
from shard_parity.placement import STACKED, mesh_axes, place_batch, place_state
from shard_parity.runtime import checkpoint
from shard_parity import config as cfg
from shard_parity.runtime import tasks
from shard_parity.step import make_optimizer, one_device_loss_and_grads
from shard_parity.tools.bisect import divergence as D
from shard_parity.tools.zoo import pp_1f1b_wrong_slot

MHA = cfg.TransformerConfig(seq_len=16, num_layers=4, num_heads=4, num_kv_heads=4, embed_dim=32)
GQA = dataclasses.replace(MHA, num_kv_heads=2)
# 8 layers: S = 4 stages of V = 2 chunks of one layer each
CONFIGS = {
    'mha': MHA, 'gqa': GQA,
    'mha8': dataclasses.replace(MHA, num_layers=8), 'gqa8': dataclasses.replace(GQA, num_layers=8),
}  # fmt: skip
TWINS = {'explicit': explicit, 'auto': auto, 'typed': typed}
# (schedule, model, stages S, microbatches M): S = 2, 4 with M = S and 2S, MHA and GQA in turn
SCHEDULES = [
    ('1f1b', 'gqa', 2, 2), ('1f1b', 'mha', 2, 4), ('1f1b', 'mha', 4, 4), ('1f1b', 'gqa', 4, 8),
    ('interleaved', 'mha', 2, 2), ('interleaved', 'gqa', 2, 4),
    ('interleaved', 'mha8', 4, 4), ('interleaved', 'gqa8', 4, 8),
]  # fmt: skip
GRID = [(t, *s) for t in TWINS for s in SCHEDULES]
FAST = [  # typed's cheapest too: its schedules once failed on jax 0.12, CI's fast-tier leg
    ('explicit', '1f1b', 'gqa', 2, 2), ('explicit', 'interleaved', 'mha', 2, 2),
    ('typed', '1f1b', 'gqa', 2, 2),
]  # fmt: skip
# auto's and typed's four-stage cases in the exhaustive tier (explicit's, and their two-stage
# cases of each schedule and attention, in the suite)
CASES = [pytest.param(*c, marks=tier(c in FAST, c[0] != 'explicit' and c[3] == 4)) for c in GRID]
VIRTUAL = {'1f1b': 1, 'interleaved': 2}


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


def schedule_plan(mesh, microbatches, virtual=1, schedule=None):
    """pp's plan on `mesh` under 1f1b (V = 1), interleaved (V > 1) or `schedule`."""
    schedule = schedule or ('interleaved' if virtual > 1 else '1f1b')
    v = virtual if schedule == 'interleaved' else None
    return plan_of(mesh, 'pp', microbatches=microbatches, schedule=schedule, virtual=v)


def schedule_loss_and_grads(module, case, stages, microbatches, virtual, twin=explicit):
    mesh = pp_mesh(stages, twin)
    graphdef, _, state = fresh_state(case=case)
    plan = schedule_plan(mesh, microbatches, virtual)
    fn = module.loss_and_grads(graphdef, case.loss_fn, mesh, plan)
    placed = place_state(jax.tree.map(np.array, state), mesh, plan)
    return fn(placed.params, place_batch(case.batches.batch(0), mesh, plan))


# --- The table: what each stage runs at each tick ---


def simulate(stages, microbatches, virtual, table=None):
    """Runs the table's bookkeeping alone: per stage, which unit's input each `saved` slot holds,
    and when each unit's input and gradient were handed over. Returns the units each stage ran
    forward and backward, in order; asserts every hand-over and read on the way."""
    table = table or one_f_one_b(stages, microbatches, virtual)
    S, V = stages, virtual
    f, b = table.forward, table.backward
    saved = [dict() for _ in range(S)]  # stage -> slot -> (microbatch, chunk)
    sent, back = {}, {}  # (stage, microbatch, chunk) -> the tick its input / gradient arrived
    ran = {'forward': [[] for _ in range(S)], 'backward': [[] for _ in range(S)]}
    for t in range(len(f['on'])):
        for s in range(S):
            if t < table.phases[0] + table.phases[1]:  # every tick with forwards writes a slot,
                saved[s][int(f['slot'][t, s])] = None  # the bubble's too (its input: garbage)
            if f['on'][t, s]:
                m, v = int(f['mb'][t, s]), int(f['chunk'][t, s])
                if (s, v) != (0, 0):  # the embedding feeds stage 0's chunk 0
                    assert sent.pop((s, m, v)) == t, ('forward input late or early', t, s, m, v)
                saved[s][int(f['slot'][t, s])] = (m, v)
                ran['forward'][s].append((m, v))
                nxt = (s + 1, m, v) if s < S - 1 else (0, m, v + 1)
                if nxt[2] < V:
                    sent[nxt] = t + 1
                else:  # the loss: the last chunk's backward takes its gradient at once
                    back[(s, m, v)] = t
            if b['on'][t, s]:
                m, v = int(b['mb'][t, s]), int(b['chunk'][t, s])
                assert back.pop((s, m, v)) == t, ('gradient late or early', t, s, m, v)
                assert saved[s].get(int(b['slot'][t, s])) == (m, v), ('input overwritten', t, s)
                ran['backward'][s].append((m, v))
                prev = (s - 1, m, v) if s > 0 else (S - 1, m, v - 1)
                if prev[2] >= 0:
                    back[prev] = t + 1
    assert not sent and not back
    return ran, table


@pytest.mark.parametrize('virtual', [1, 2, 3])
def test_the_table_hands_each_unit_its_input_and_gradient_in_time(virtual):
    """For S = 1..4 and M = S..3S (multiples of S when interleaved): every stage runs every
    (microbatch, chunk) once forward and once backward; each forward's input arrived the tick
    before, each backward's gradient too (the last chunk's at its forward's tick, from the
    loss), and its saved input is still in its slot; the forward ticks are V M + S - 1, the
    bubble (S - 1)/(V M + S - 1) of them on every stage."""
    for stages in range(1, 5):
        for microbatches in range(stages, 3 * stages + 1, stages if virtual > 1 else 1):
            ran, table = simulate(stages, microbatches, virtual)
            units = sorted(itertools.product(range(microbatches), range(virtual)))
            for s in range(stages):
                assert sorted(ran['forward'][s]) == units and sorted(ran['backward'][s]) == units
            forward_ticks = table.phases[0] + table.phases[1]
            assert forward_ticks == virtual * microbatches + stages - 1
            idle = 1 - table.forward['on'][:forward_ticks].mean(0)
            bubble = (stages - 1) / (virtual * microbatches + stages - 1)
            np.testing.assert_allclose(idle, bubble)
            assert table.slots == 2 * virtual * stages - 1  # S-bound, whatever M


def test_the_table_check_can_fail():
    """A backward reading the next slot (tools/zoo/pp_1f1b_wrong_slot.py's mistake) finds
    another unit's input there."""
    table = one_f_one_b(2, 4)
    wrong = dict(table.backward, slot=(table.backward['slot'] + 1) % table.slots)
    with pytest.raises(AssertionError, match='input overwritten'):
        simulate(2, 4, 1, table._replace(backward=wrong))


# --- Parity with one device ---


@pytest.mark.parametrize(
    'name, schedule, model, stages, microbatches',
    CASES,
    ids=[f'{t}-{s}-{m}-S{n}-M{k}' for t, s, m, n, k in GRID],
)
def test_schedule_matches_the_one_device_run(
    name, schedule, model, stages, microbatches, one_device
):
    """One step in float32: the loss and every gradient leaf, the stages' layers included."""
    case, want_metrics, want_grads = one_device(model)
    twin = TWINS[name]
    metrics, grads = schedule_loss_and_grads(
        twin.SCHEDULES[schedule], case, stages, microbatches, VIRTUAL[schedule], twin
    )
    assert_close(metrics['loss'], want_metrics['loss'], 'loss', **TOL)
    assert_trees_close(grads, want_grads, **TOL)


@pytest.mark.parametrize('virtual', [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_backward_on_another_microbatchs_input_is_caught(virtual, one_device):
    """The comparison can fail: tools/zoo/pp_1f1b_wrong_slot.py runs each backward on the next
    slot's saved input. The forward is right, so the loss still matches; the gradients do not."""
    case, want_metrics, want_grads = one_device('mha')
    metrics, grads = schedule_loss_and_grads(pp_1f1b_wrong_slot, case, 2, 4, virtual)
    assert_close(metrics['loss'], want_metrics['loss'], 'loss', **TOL)
    with pytest.raises(AssertionError):
        assert_trees_close(grads, want_grads, **TOL)


@pytest.mark.slow
def test_the_bisector_finds_the_wrong_slot_in_the_gradients():
    """tools.bisect against GPipe (explicit/pp.py), one step on 4x2 at the modules' default
    M = 4, V = 1: the right 1F1B schedule agrees everywhere; the zoo's wrong slot passes the
    forward and the loss and parts at the gradients, every block's and both embeddings' leaves,
    but not the final norm's (the last stage takes it from the right forward)."""
    case = make_case('transformer', GQA)
    graphdef, tx, state = fresh_state(case=case)
    mesh = pp_mesh(2)
    reports = {}
    for other in ('explicit.pp_1f1b', 'tools.zoo.pp_1f1b_wrong_slot'):
        sides = [D.load_side(n, plan_of(mesh, 'pp'), mesh) for n in ('explicit', other)]
        reports[other] = D.bisect(*sides, graphdef, case.loss_fn, tx, state, case.batches, 1)
    assert reports['explicit.pp_1f1b'].step is None, reports['explicit.pp_1f1b']
    report = reports['tools.zoo.pp_1f1b_wrong_slot']
    assert (report.step, report.phase) == (0, 'gradients'), report
    paths = {leaf.path for leaf in report.leaves}
    assert {'blocks.ffn.up.kernel', 'embed.embedding', 'pos.embedding'} <= paths, paths
    assert 'norm.scale' not in paths, paths


# each schedule's 20 steps in explicit and in one other twin, auto's and typed's turn about;
# the rest in the exhaustive tier (every twin's one step of each schedule: above)
TRACKS = [('1f1b', t) for t in TWINS] + [('interleaved', t) for t in TWINS]
TRACKED = {('1f1b', 'explicit'), ('1f1b', 'typed'), ('interleaved', 'explicit'),
           ('interleaved', 'auto')}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    'schedule, name',
    [pytest.param(*c, marks=[] if c in TRACKED else [pytest.mark.exhaustive]) for c in TRACKS],
    ids=[f'{s}-{t}' for s, t in TRACKS],
)
def test_20_steps_track_the_one_device_run(schedule, name):
    """20 AdamW steps on 4x2 (S = 2, M = 4; interleaved V = 2) of GQA: the float32 losses step
    by step, and every loss and parameter of the float64 rerun (helpers.py's error model)."""
    case = make_case('transformer', GQA)
    want_32, want_64 = one_device_runs(case)
    twin, mesh = TWINS[name], pp_mesh(2, TWINS[name])
    virtual = VIRTUAL[schedule] if schedule == 'interleaved' else None
    options = {'schedule': schedule, 'virtual': virtual}
    losses, _ = train_twin(twin, mesh, case, strategy='pp', **options)
    assert_close(losses, want_32[0], 'float32 losses', **LOSS_TOL)
    losses, params = train_twin_x64(twin, mesh, case, strategy='pp', **options)
    assert_close(losses, want_64[0], 'float64 losses', **X64_TOL)
    assert_params_close(params, want_64[1], **X64_TOL)


# --- Memory: what each schedule keeps for the backward ---

MEMORY = cfg.TransformerConfig(seq_len=64, num_layers=8, num_heads=4, num_kv_heads=4, embed_dim=64)


def temp_mib(module, stages, microbatches, rows=2, twin=explicit, virtual=None):
    """The compiled loss_and_grads' temporary MiB per device (memory_analysis: compiled, never
    run), with `rows` rows per microbatch on each 'data' device: M microbatches of the same
    size, so that a schedule keeping every microbatch's activations grows with M."""
    mesh = pp_mesh(stages, twin)
    plan = schedule_plan(mesh, microbatches, virtual or 1, None if virtual else 'gpipe')
    tx = make_optimizer(cfg.TrainConfig())
    graphdef, state = abstract_state(lambda r: Transformer(MEMORY, rngs=r), tx, mesh, plan)
    shape = (mesh.shape['data'] * microbatches * rows, MEMORY.seq_len)
    token = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=NamedSharding(mesh, P('data')))
    fn = module.loss_and_grads(graphdef, tasks.lm_loss, mesh, plan)
    compiled = fn.lower(state.params, {'x': token, 'y': token}).compile()
    return compiled.memory_analysis().temp_size_in_bytes / 2**20


def mib(avals):
    return sum(np.prod(a.shape) * np.dtype(a.dtype).itemsize for a in avals) / 2**20


def schedule_bound_mib(stages, virtual, rows=2):
    """docs/pipeline.md's bound on 1F1B's (V = 1) and interleaved's temp per device, from the
    shapes alone (nothing compiled): the 2VS - 1 saved stage inputs f32[rows, T, C]; in a tick
    one forward unit and one backward unit through a chunk of L/(SV) layers, the backward's
    residuals recomputed and their cotangents: 3 x what `jax.vjp` of a chunk on one microbatch
    saves (jax's saved_residuals, the weights and the input left out); the stage's gradients
    (its L/S layers and the rest, f32) twice, the carried sum and the tick's term; and 1 MiB
    for XLA's fixed overheads."""
    from jax._src.ad_checkpoint import saved_residuals

    tx = make_optimizer(cfg.TrainConfig())
    mesh = pp_mesh(2)
    graphdef, state = abstract_state(
        lambda r: Transformer(MEMORY, rngs=r), tx, mesh, plan_of(mesh, 'pp')
    )
    blocks, layers = state.params[STACKED], MEMORY.num_layers // (stages * virtual)
    chunk = jax.tree.map(lambda a: jax.ShapeDtypeStruct((layers, *a.shape[1:]), a.dtype), blocks)
    x = jax.ShapeDtypeStruct((rows, MEMORY.seq_len, MEMORY.embed_dim), jnp.float32)
    run = pieces(graphdef, tasks.lm_loss, state.params).run
    saved = mib([a for a, why in saved_residuals(run, chunk, x) if 'argument' not in why])
    grads = mib(jax.tree.leaves(blocks)) / stages + mib(jax.tree.leaves(rest_of(state.params)))
    return (2 * virtual * stages - 1) * mib([x]) + 3 * saved + 2 * grads + 1.0


MEMORY_CASES = [(t, s) for t in TWINS for s in (2, 4)]


@pytest.mark.parametrize(
    'name, stages',
    # S = 4 in auto and typed: the exhaustive tier
    [
        pytest.param(*c, marks=tier(c == ('explicit', 2), c[1] == 4 and c[0] != 'explicit'))
        for c in MEMORY_CASES
    ],  # fmt: skip
    ids=[f'{t}-S{s}' for t, s in MEMORY_CASES],
)
def test_1f1b_keeps_memory_flat_in_m_where_gpipe_grows(name, stages):
    """Doubling M (microbatches of the same size) at fixed S: GPipe's temp grows by at least
    the added microbatches' stage inputs (measured: 1.4-1.7 x), 1F1B's and interleaved's not at
    all (they keep at most 2VS - 1 stage inputs, and one chunk's activations at a time), and
    stays within the schedule's bound from the shapes (schedule_bound_mib; explicit measures
    0.45-0.84 of it, all twins), which GPipe at M = 2S exceeds: the bound can fail."""
    twin, m = TWINS[name], stages
    gpipe = [temp_mib(twin.pp, stages, k, twin=twin) for k in (m, 2 * m)]
    inputs = m * 2 * MEMORY.seq_len * MEMORY.embed_dim * 4 / 2**20  # M more [2, T, C] f32
    assert gpipe[1] - gpipe[0] >= inputs * MEMORY.num_layers / stages, gpipe  # the check can fail
    bound = {virtual: schedule_bound_mib(stages, virtual) for virtual in (1, 2)}
    assert gpipe[1] > bound[1], (gpipe, bound)
    for virtual in (1, 2):
        flat = [temp_mib(twin.pp_1f1b, stages, k, twin=twin, virtual=virtual) for k in (m, 2 * m)]
        assert flat[1] <= flat[0] * 1.01, (virtual, flat)
        assert flat[0] < gpipe[0], (virtual, flat, gpipe)
        assert flat[1] <= bound[virtual], (virtual, flat, bound)


# --- The bubble, from the compiled FLOPs, and the picture ---


@pytest.mark.slow  # compiles 24 small programs
def test_each_schedules_bubble_from_its_compiled_flops_is_the_formula():
    """benchmarks/pipeline.py's schedule_bubbles on S = 2, M = 2 and 4, V = 2 (16 layers minus
    8, width 32): the blocks' FLOPs per stage device against one stage's / S give (S - 1)/(VM +
    S - 1), within 0.005, for gpipe, 1f1b and interleaved: interleaving's smaller bubble is in
    the compiled program, not only in the table. The check can fail: interleaved's bubble is
    not 1f1b's."""
    from benchmarks.pipeline import schedule_bubbles

    rows = schedule_bubbles(2, (2, 4), (8, 16), 2, shape=(32, 16, 16))
    for r in rows:
        assert abs(r['bubble'] - r['formula']) < 0.005, r
    by = {(r['schedule'], r['M']): r['bubble'] for r in rows}
    assert by['interleaved', 2] < by['1f1b', 2] - 0.1, by


@pytest.mark.exhaustive  # compiles 24 composed programs, about 70 s
def test_each_schedules_bubble_on_a_composed_mesh_is_the_formula():
    """The same on fsdp:2,model:2 inside each stage (S = 2, V = 2, 16 layers minus 8: units of
    two layers or more): the axes inside a stage do not change which units run. With units of
    one layer (8 minus 4) interleaved's FLOPs bubble reads 0.35 and 0.27 at M = 2 and 4, not
    0.20 and 0.11: one-layer units compile otherwise (docs/pipeline.md), and the difference
    no longer isolates the blocks."""
    from benchmarks.pipeline import schedule_bubbles

    rows = schedule_bubbles(2, (2, 4), (8, 16), 2, shape=(64, 32, 32), inside='fsdp:2,model:2')
    for r in rows:
        assert abs(r['bubble'] - r['formula']) < 0.005, r


def test_the_trace_draws_every_unit_once_per_stage():
    """benchmarks/pipeline.py --trace: per schedule and stage, each (microbatch, chunk) once
    forward and once backward, on the table's ticks."""
    from benchmarks.pipeline import trace

    events = [e for e in trace(2, 4, 2)['traceEvents'] if e['ph'] == 'X']
    for pid, v in enumerate((1, 1, 2)):
        for s in range(2):
            mine = sorted(e['name'] for e in events if (e['pid'], e['tid']) == (pid, s))
            chunks = [f':{c}' for c in range(v)] if v > 1 else ['']
            assert mine == sorted(f'{k}{m}{c}' for k in 'BF' for m in range(4) for c in chunks)


@pytest.mark.slow  # compiles four programs
@pytest.mark.pinned
def test_inspector_pins_1f1bs_collectives_the_loss_on_the_last_stage():
    """`python -m inspector --strategy=pp --mesh=2x4 --pp_schedule=1f1b` (docs/pipeline.md's
    table, at its setting: M = 4, 8 layers, T 16, C 32): explicit hands a microbatch's
    activations f32[2, 16, 32] on with a collective-permute, 14 of them over the ticks, as
    GPipe's; over 'stage' after the ticks one all-reduce of the embeddings', norm's and head's
    gradients and the metrics, where GPipe all-reduces the last stage's outputs (each way); over
    'data' the same gradient all-reduce as GPipe's. The check can fail: GPipe's differ."""
    shape = {'seq_len': 16, 'num_layers': 8, 'num_heads': 4, 'num_kv_heads': 2, 'embed_dim': 32}
    over = {}
    for schedule in ('gpipe', '1f1b'):
        r = inspect_collectives('transformer', 'pp', (2, 4), 16, schedule, **shape)
        ops = r['programs']['explicit']
        permutes = [op for op in ops if op['kind'] == 'collective-permute']
        assert {tuple(map(tuple, op['shapes'])) for op in permutes} == {((2, 16, 32),)}
        assert sum(op['trip_count'] for op in permutes) == 14, permutes
        reduces = [op for op in ops if op['kind'] == 'all-reduce']
        over[schedule] = {
            axis: sorted(op['bytes'] for op in reduces if op['group_size'] == size)
            for axis, size in (('stage', 4), ('data', 2))
        }
        assert all(op['trip_count'] == 1 for op in reduces), schedule
        if schedule == '1f1b':
            assert r['pp_schedule'] == '1f1b' and r['sources']['explicit']['file'].endswith(
                'pp_1f1b.py'
            )
    # GPipe: the outputs f32[4, 2, 16, 32] each way, the metrics (28 B) riding with one of them
    assert over['gpipe']['stage'] == [16_384, 16_412]
    assert over['1f1b']['stage'] == [34_976]  # the rest's gradients and the metrics, once
    # the blocks' gradients and the rest's with the mean loss: 125,568 + 4 B
    assert over['1f1b']['data'] == over['gpipe']['data'] == [34_948, 90_624]


# --- Checkpoints and the CLI ---


@pytest.mark.slow
def test_the_cli_trains_each_schedule_and_checkpoints_move_between_them(tmp_path):
    """The train CLI on 4x2: explicit's 1f1b saves after 2 steps, auto's interleaved resumes
    that checkpoint, typed's 1f1b the interleaved one, and explicit's gpipe typed's;
    config.json records each run's schedule. The checkpoints of 1f1b's and interleaved's steps,
    restored on pp's 4x2 and dp's 8x1, give bitwise the same logits (every schedule places the
    blocks L/S layers per stage, so a checkpoint is the same global arrays)."""
    shape = ['--model=transformer', '--strategy=pp', '--mesh=4x2', '--num_layers=4']
    shape += ['--seq_len=16', '--embed_dim=32', '--batch_size=16', '--cpu_devices=8']
    shape += ['--eval_every=2', '--keep=10', f'--workdir={tmp_path}']
    for twin, steps, schedule in (('explicit', 2, '1f1b'), ('auto', 4, 'interleaved')) + (
        ('typed', 6, '1f1b'),
        ('explicit', 8, 'gpipe'),
    ):
        result = run_cli(twin, *shape, f'--steps={steps}', f'--pp_schedule={schedule}')
        assert result.returncode == 0, result.stderr[-2000:]
        assert read_metrics(tmp_path)[-1]['step'] == steps
        config = (tmp_path / 'config.json').read_text()
        assert (f'"pp_schedule": "{schedule}"' in config) == (schedule != 'gpipe'), config
    # the 1f1b run's step 2 and the interleaved run's step 4, restored on 4x2 and on dp's 8x1
    case = make_case('transformer', MHA)
    tokens, one = case.batches.batch(0)['x'], jax.devices()[0]
    seen = []
    for step in (2, 4):
        got = []
        for strategy, shape in (('pp', (4, 2)), ('dp', (8, 1))):
            mesh = make_mesh(shape=shape, axes=mesh_axes(strategy))
            _, graphdef, state = checkpoint.restore(tmp_path, mesh, plan_of(mesh, strategy), step)
            got.append(logits(graphdef, state.params, tokens, one))
        np.testing.assert_array_equal(got[0], got[1])
        seen.append(got[0])
    assert not np.array_equal(seen[0], seen[1])  # the check can fail: steps 2 and 4 differ
