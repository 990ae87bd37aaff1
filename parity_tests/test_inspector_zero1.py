"""Claim: under ZeRO-1 (--shard_optimizer_over_data, docs/zero1.md) the inspector reads the three
twins' programs on the CPU as the same step. XLA:CPU forms no reduce-scatter from an all-reduce
and a slice, so auto/ and typed/, which leave the `zero1` piece's reduce-scatter over 'data' to
the compiler, compile it as an all-reduce of each whole gradient, each device then keeping its
1/n (inspector/mechanisms.py's `sliced`: a dynamic-slice of it, a scatter of it into zeros of
1/n its size, a slice of the stack it is concatenated into, or of the sum a loop adds it up
to); explicit/ writes psum_scatter. The twins' comparison (inspector/compare.py) counts that
form as the reduce-scatter it does the work of, pairs one layer's pieces with the stacked
operand they make up, and names it with its mechanism (`same_as_written`), no twin difference;
a reduction run once per iteration of a loop is named with its trips. A real difference stays
one: a reduce-scatter explicit/ writes that the other twin lacks, pieces that do not make up
the stack, a missing all-gather of the params, the bug zoo's zero1_wrong_shard (a
collective-permute of each shard). Compile only."""

import copy
import dataclasses
import json

import jax
import pytest
from jax.sharding import AxisType

from parity_tests.helpers import TINY_TRANSFORMER
from shard_parity import config as cfg
from shard_parity import explicit
from shard_parity import plan as plans
from shard_parity.devices import libtpu_installed
from shard_parity.inspector import compare, twins
from shard_parity.inspector import target as targets
from shard_parity.inspector.hlo import logical
from shard_parity.inspector.hlo_module import Module
from shard_parity.inspector.mechanisms import stands_for
from shard_parity.mesh import mesh_for
from shard_parity.tools.zoo import zero1_wrong_shard

ZERO1 = frozenset({('sliced', 'reduce-scatter', ('data',))})
# The MLP's split gradients ([784, 512], [512], [512, 512], [512], [512, 10]), 1/8 of each kept
SPLIT = [(784, 512), (512,), (512, 512), (512,), (512, 10)]


def op(kind, shapes, stands_for=(), line=1, axes=('data',)):
    return {'kind': kind, 'group_size': 8, 'shapes': [list(s) for s in shapes],
            'axes': list(axes), 'stands_for': list(stands_for), 'file': f'{kind}.py',
            'line': line, 'flags': []}  # fmt: skip


def sliced(n, shape, kept=None):
    return {'kind': 'reduce-scatter', 'mechanism': 'sliced', 'operand': n,
            'shape': list(kept or eighth(shape)),
            'reason': f'a reduce-scatter done as an all-reduce of the whole f32{list(shape)}'}


def eighth(shape):
    return (shape[0] // 8, *shape[1:])


def programs(auto_split=SPLIT, gathers=True, extra=()):
    """explicit/'s ZeRO-1 step as XLA:CPU compiles it (a reduce-scatter per split gradient, the
    [10] bias and the metrics all-reduced, the params all-gathered) and auto/'s (one tuple
    all-reduce, each split operand `sliced`), as analyse() reads them."""
    gather = [op('all-gather', [s], line=30) for s in SPLIT]
    explicit_ops = [op('reduce-scatter', [eighth(s)], line=22) for s in SPLIT]
    explicit_ops += [op('all-reduce', [(10,), (), ()], line=83)] + gather + list(extra)
    shapes = [*auto_split, (10,), (), ()]
    auto_ops = [op('all-reduce', shapes, [sliced(n, s) for n, s in enumerate(auto_split)], 34)]
    auto_ops += copy.deepcopy(gather) if gathers else []
    return {'auto': auto_ops, 'explicit': explicit_ops}


def test_the_sliced_reduce_scatter_is_named_not_a_difference():
    """The same programs: without the form a difference on both sides (what the report said
    before), with it none, and one line naming the all-reduce as explicit's reduce-scatter."""
    p = programs()
    assert len(compare.difference_lines(p, 'auto')) == 2  # the comparison can fail
    assert compare.difference_lines(p, 'auto', ZERO1) == []
    assert compare.differences(p['auto'], p['explicit'], 'auto', ZERO1) == []
    (named,) = compare.named_lines(p, 'auto', ZERO1)
    assert (named['twin'], named['kind'], named['as'], named['count']) == (
        'auto', 'all-reduce', 'reduce-scatter', 5)
    assert named['mechanism'] == 'sliced' and named['sibling_lines'] == ['reduce-scatter.py:22']
    assert "are explicit's reduce-scatter" in named['what'] and 'sliced' in named['what']
    assert compare.named_lines(p, 'auto') == []  # no form: nothing named


def test_a_real_difference_is_still_reported():
    """A reduce-scatter explicit writes that auto lacks (auto slices one gradient fewer, and
    all-reduces it whole), a missing all-gather of the params, an extra collective: each stays
    a difference, flagged on the op; only the operands that match are named."""
    p = programs(auto_split=SPLIT[1:], gathers=True)
    p['auto'][0]['shapes'].insert(0, list(SPLIT[0]))  # [784, 512] all-reduced, kept whole
    p['auto'][0]['stands_for'] = [sliced(n + 1, s) for n, s in enumerate(SPLIT[1:])]
    lines = compare.difference_lines(p, 'auto', ZERO1)
    assert {(d['twin'], d['kind']) for d in lines} == {
        ('auto', 'all-reduce'), ('explicit', 'reduce-scatter')}
    (named,) = compare.named_lines(p, 'auto', ZERO1)
    assert named['count'] == 4
    compare.mark_differences(p, lines, ZERO1)
    assert 'twin-difference' in p['auto'][0]['flags']

    p = programs(gathers=False)
    found = compare.differences(p['auto'], p['explicit'], 'auto', ZERO1)
    assert len(found) == 4 and all(d.startswith('explicit has all-gather of') for d in found)
    assert 'explicit has all-gather of 401,408 elements over 8 devices that auto lacks (x1)' in (
        found)
    p = programs(extra=[op('collective-permute', [eighth(SPLIT[0])], line=7)])
    assert [d['kind'] for d in compare.difference_lines(p, 'auto', ZERO1)] == ['collective-permute']


def test_only_zero1_names_the_form():
    """The form is ZeRO-1's: FSDP's reduce-scatter compiled the same way stays a difference
    (docs/inspector.md), and a 'sliced' part over another axis is not named."""
    assert compare.written_forms(plans.parse('data:8', None, 8, zero1=True)) == ZERO1
    assert compare.written_forms(plans.parse(None, 'fsdp', 8)) == frozenset()
    p = programs()
    for o in p['auto']:
        o['axes'] = ['fsdp']
    assert compare.named_lines(p, 'auto', ZERO1) == []
    assert compare.difference_lines(p, 'auto', ZERO1)


# One layer's gradient of a [2, 32, 64] stack, 1/8 of it kept ([4, 64]); explicit/ scatters the
# stack whole ([2, 4, 64] kept) where auto/ reduces each layer's slice where the backward forms it
LAYER, STACK = (32, 64), (2, 4, 64)


def layered(kept=((4, 64), (4, 64)), whole=0, trips=1):
    """explicit/'s reduce-scatter of the stack and auto/'s all-reduce of its layers' pieces,
    each piece `sliced` to `kept` (the first `whole` of them all-reduced and kept whole)."""
    parts = [sliced(n, LAYER, k) for n, k in enumerate(kept) if n >= whole]
    auto_op = op('all-reduce', [LAYER] * len(kept), parts, line=118) | {'trip_count': trips}
    return {'auto': [auto_op], 'explicit': [op('reduce-scatter', [STACK], line=22)]}


def test_layer_pieces_pair_with_the_stacked_operand():
    """Two layers' pieces, each keeping [4, 64], make up explicit's stacked [2, 4, 64]: no
    difference, one line naming both as explicit's reduce-scatter, a layer's piece each. Not
    paired (a difference on both sides): one piece all-reduced and kept whole, pieces whose
    kept shape is not the stack's split along its layers ([8, 32]), a third layer's piece."""
    p = layered()
    keys = [key for key, _ in compare.operands(p['auto'][0], ZERO1)]
    assert keys == [('reduce-scatter', 8, 256)] * 2  # each piece alone differs from the stack
    assert compare.differences(p['auto'], p['explicit'], 'auto', ZERO1) == []
    (named,) = compare.named_lines(p, 'auto', ZERO1)
    assert (named['count'], named['layers'], named['trips']) == (2, 2, 1)
    assert "one layer's piece each of an operand explicit moves stacked" in named['what']
    assert 'x1' not in named['what']  # no loop to name
    both = {('auto', 'reduce-scatter'), ('explicit', 'reduce-scatter')}
    for bad, sides in (
        (layered(whole=1), {('auto', 'all-reduce')} | both),  # [32, 64] kept whole
        (layered(kept=((8, 32), (8, 32))), both),
        (layered(kept=((4, 64),) * 3), {('auto', 'reduce-scatter')}),  # one piece left over
    ):
        lines = compare.difference_lines(bad, 'auto', ZERO1)
        assert {(d['twin'], d['kind']) for d in lines} == sides, lines
        compare.mark_differences(bad, lines, ZERO1)
        assert 'twin-difference' in bad['auto'][0]['flags']
    assert compare.named_lines(layered(kept=((8, 32), (8, 32))), 'auto', ZERO1) == []


def test_a_reduction_per_iteration_is_named_with_its_trips():
    """The pieces all-reduced in a pipeline's ticks' loop (x5) where explicit scatters once:
    still the reduce-scatter's work, named with its trips (5 times the bytes)."""
    (named,) = compare.named_lines(layered(trips=5), 'auto', ZERO1)
    assert (named['trips'], named['sibling_trips']) == (5, 1)
    assert "runs x5 a step (once per iteration of a loop) where explicit's runs x1" in (
        named['what'])


ADD = """HloModule m
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
"""
GROUPS = 'replica_groups={{0,1,2,3}}, to_apply=%add'
# typed/'s [32] vectors: each layer's all-reduced whole, stacked, the stack sliced
STACKED = ADD + f"""
ENTRY %main (p: f32[32], q: f32[32], i: s32[]) -> f32[2,8] {{
  %p = f32[32]{{0}} parameter(0)
  %q = f32[32]{{0}} parameter(1)
  %i = s32[] parameter(2)
  %all-reduce = (f32[32]{{0}}, f32[32]{{0}}) all-reduce(%p, %q), {GROUPS}
  %g0 = f32[32]{{0}} get-tuple-element(%all-reduce), index=0
  %g1 = f32[32]{{0}} get-tuple-element(%all-reduce), index=1
  %b0 = f32[1,32]{{1,0}} bitcast(%g0)
  %b1 = f32[1,32]{{1,0}} bitcast(%g1)
  %stack = f32[2,32]{{1,0}} concatenate(%b0, %b1), dimensions={{0}}
  %zero = s32[] constant(0)
  ROOT %slice = f32[2,8]{{1,0}} dynamic-slice(%stack, %zero, %i), dynamic_slice_sizes={{2,8}}
}}
"""
# the same as a TPU compiles the stack: each piece padded with -inf, the pads joined by maximum
PADDED = STACKED.replace(
    '  %stack = f32[2,32]{1,0} concatenate(%b0, %b1), dimensions={0}\n',
    '  %inf = f32[] constant(-inf)\n  %p0 = f32[2,32]{1,0} pad(%b0, %inf), padding=0_1x0_0\n'
    '  %p1 = f32[2,32]{1,0} pad(%b1, %inf), padding=1_0x0_0\n'
    '  %stack = f32[2,32]{1,0} maximum(%p0, %p1)\n',
)
# auto/'s position embedding: the whole gradient scattered into zeros of each device's rows
SCATTERED = ADD + f"""
ENTRY %main (p: f32[16,32], idx: s32[16,1]) -> f32[4,32] {{
  %p = f32[16,32]{{1,0}} parameter(0)
  %idx = s32[16,1]{{1,0}} parameter(1)
  %all-reduce = f32[16,32]{{1,0}} all-reduce(%p), {GROUPS}
  %c = f32[] constant(0)
  %zeros = f32[4,32]{{1,0}} broadcast(%c), dimensions={{}}
  %upd = f32[16,1,32]{{2,1,0}} bitcast(%all-reduce)
  ROOT %scatter = f32[4,32]{{1,0}} scatter(%zeros, %idx, %upd), update_window_dims={{1,2}}, \
inserted_window_dims={{}}, scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=%add
}}
"""
# the same at XLA:CPU's --xla_backend_optimization_level=0 (the test tier's): the scatter
# expanded into a loop writing each row into the zeros
CARRY = '(s32[], f32[4,32]{1,0}, s32[16]{0}, f32[16,32]{1,0})'
EXPANDED = ADD + f"""
%rows (p: (s32[], f32[4,32], s32[16], f32[16,32])) -> (s32[], f32[4,32], s32[16], f32[16,32]) {{
  %p = {CARRY} parameter(0)
  %n = s32[] get-tuple-element(%p), index=0
  %buf = f32[4,32]{{1,0}} get-tuple-element(%p), index=1
  %idx = s32[16]{{0}} get-tuple-element(%p), index=2
  %upd = f32[16,32]{{1,0}} get-tuple-element(%p), index=3
  %z = s32[] constant(0)
  %row = f32[1,32]{{1,0}} dynamic-slice(%upd, %n, %z), dynamic_slice_sizes={{1,32}}
  %new = f32[4,32]{{1,0}} dynamic-update-slice(%buf, %row, %n, %z)
  %one = s32[] constant(1)
  %m = s32[] add(%n, %one)
  ROOT %t = {CARRY} tuple(%m, %new, %idx, %upd)
}}
%more (p: (s32[], f32[4,32], s32[16], f32[16,32])) -> pred[] {{
  %p = {CARRY} parameter(0)
  %n = s32[] get-tuple-element(%p), index=0
  %k = s32[] constant(16)
  ROOT %lt = pred[] compare(%n, %k), direction=LT
}}
%expanded (t: (s32[], f32[4,32], s32[16], f32[16,32])) -> (s32[], f32[4,32], s32[16], f32[16,32]) {{
  %t = {CARRY} parameter(0)
  ROOT %w = {CARRY} while(%t), condition=%more, body=%rows
}}
ENTRY %main (p: f32[16,32], idx: s32[16]) -> f32[4,32] {{
  %p = f32[16,32]{{1,0}} parameter(0)
  %idx = s32[16]{{0}} parameter(1)
  %all-reduce = f32[16,32]{{1,0}} all-reduce(%p), {GROUPS}
  %c = f32[] constant(0)
  %zeros = f32[4,32]{{1,0}} broadcast(%c), dimensions={{}}
  %z = s32[] constant(0)
  %in = {CARRY} tuple(%z, %zeros, %idx, %all-reduce)
  %call = {CARRY} call(%in), to_apply=%expanded
  ROOT %out = f32[4,32]{{1,0}} get-tuple-element(%call), index=1
}}
"""
# typed/'s pipeline: a layer's gradient all-reduced each tick, added to the loop's carry, the
# sum sliced after the loop
LOOPED = ADD + f"""
%body (s: (s32[], f32[16], f32[16])) -> (s32[], f32[16], f32[16]) {{
  %s = (s32[], f32[16]{{0}}, f32[16]{{0}}) parameter(0)
  %n = s32[] get-tuple-element(%s), index=0
  %acc = f32[16]{{0}} get-tuple-element(%s), index=1
  %g = f32[16]{{0}} get-tuple-element(%s), index=2
  %all-reduce = f32[16]{{0}} all-reduce(%g), {GROUPS}
  %sum = f32[16]{{0}} add(%acc, %all-reduce)
  %one = s32[] constant(1)
  %m = s32[] add(%n, %one)
  ROOT %t = (s32[], f32[16]{{0}}, f32[16]{{0}}) tuple(%m, %sum, %g)
}}
%cond (s: (s32[], f32[16], f32[16])) -> pred[] {{
  %s = (s32[], f32[16]{{0}}, f32[16]{{0}}) parameter(0)
  %n = s32[] get-tuple-element(%s), index=0
  %five = s32[] constant(5)
  ROOT %lt = pred[] compare(%n, %five), direction=LT
}}
ENTRY %main (a: f32[16], g: f32[16], i: s32[]) -> f32[4] {{
  %a = f32[16]{{0}} parameter(0)
  %g = f32[16]{{0}} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  %init = (s32[], f32[16]{{0}}, f32[16]{{0}}) tuple(%z, %a, %g)
  %loop = (s32[], f32[16]{{0}}, f32[16]{{0}}) while(%init), condition=%cond, body=%body
  %total = f32[16]{{0}} get-tuple-element(%loop), index=1
  ROOT %mine = f32[4]{{0}} dynamic-slice(%total, %i), dynamic_slice_sizes={{4}}
}}
"""


def kept(text: str) -> list:
    """Per operand of the program's one all-reduce that is `sliced`: the shape kept."""
    m = Module(text)
    (found,) = logical(m)
    return [p['shape'] for p in stands_for(m, found) if p['mechanism'] == 'sliced']


def test_the_slice_is_read_through_a_stack_a_scatter_and_a_loop():
    """mechanisms.py's `sliced` (inspector/slices.py), read in the program: each layer's [32]
    all-reduced then stacked (a concatenate, or a TPU's pads of -inf joined by maximum) and the
    stack sliced [2, 8] (a [1, 8] share each); the [16, 32] gradient scattered into zeros of
    [4, 32] (by a scatter, or by the loop XLA expands one into); the [16] all-reduced in a
    loop, summed in its carry, the sum sliced [4]. Each check can fail: the stack also read
    whole, pads of zeros, the scatter into what is not zeros, the expanded loop's whole read
    after it or no row written, the sum read whole, a sum that is not the loop's carry."""
    assert kept(STACKED) == [[1, 8], [1, 8]] == kept(PADDED)
    assert kept(SCATTERED) == [[4, 32]] == kept(EXPANDED)
    assert kept(LOOPED) == [[4]]
    whole = STACKED.replace('  ROOT %slice', '  %c = f32[] constant(0)\n  %r = f32[] reduce('
                            '%stack, %c), dimensions={0,1}, to_apply=%add\n  %slice')
    whole = whole.replace('dynamic_slice_sizes={2,8}\n', 'dynamic_slice_sizes={2,8}\n'
                          '  ROOT %out = (f32[2,8]{1,0}, f32[]) tuple(%slice, %r)\n')
    assert whole != STACKED and kept(whole) == []
    zeros = PADDED.replace('constant(-inf)', 'constant(0)')  # a maximum of pads, no stack
    assert PADDED != STACKED and zeros != PADDED and kept(zeros) == []
    assert kept(SCATTERED.replace('constant(0)', 'constant(1)')) == []
    whole = EXPANDED.replace('  ROOT %out = f32[4,32]{1,0}', '  %all = f32[16,32]{1,0} '
                             'get-tuple-element(%call), index=3\n  %r = f32[] reduce(%all, %c), '
                             'dimensions={0,1}, to_apply=%add\n  ROOT %out = f32[4,32]{1,0}')
    assert whole != EXPANDED and kept(whole) == []  # the loop hands the whole sum on, read
    no_rows = EXPANDED.replace('dynamic-update-slice(%buf, %row, %n, %z)', 'add(%buf, %buf)')
    assert no_rows != EXPANDED and kept(no_rows) == []
    read_whole = LOOPED.replace('ROOT %mine = f32[4]{0} dynamic-slice(%total, %i), '
                                'dynamic_slice_sizes={4}', 'ROOT %mine = f32[16]{0} negate(%total)')
    assert read_whole != LOOPED and kept(read_whole) == []
    not_carried = LOOPED.replace('add(%acc, %all-reduce)', 'add(%g, %all-reduce)')
    assert not_carried != LOOPED and kept(not_carried) == []


def report(model='mlp', text='data:8', module=None, monkeypatch=None, batch=None, target=None,
           **options):  # fmt: skip
    """The inspector over the twins' ZeRO-1 step on the CPU, or compiled for `target`
    (`module`: explicit/'s file replaced by it, as tools.bisect --twins runs a zoo entry), as
    its --json prints it."""
    devices = targets.devices(target) if target else jax.devices()
    plan = plans.parse(text, None, len(devices), zero1=True, **options)
    mesh = mesh_for(plan, AxisType.Auto, devices=devices)
    if module is not None:
        chosen = twins.strategy_file
        monkeypatch.setattr(twins, 'strategy_file',
                            lambda twin, plan: module if twin is explicit else chosen(twin, plan))
    config = cfg.TRAIN_DEFAULTS[model]
    config = dataclasses.replace(config, batch_size=batch) if batch else config
    r = twins.inspect(model, config, mesh, plan, TINY_TRANSFORMER, target=target)
    return json.loads(json.dumps(r))


def test_the_three_twins_read_as_one_step_on_the_cpu():
    """The MLP on data:8: no difference between the twins; auto's and typed's all-reduce of
    the five split gradients named as explicit's reduce-scatter, mechanism `sliced`; no twin
    surprise; the expectation's rows match explicit's program to the byte."""
    r = report()
    assert r['differences'] == [] and r['typed_differences'] == [], r['difference_lines']
    named = {(d['twin'], d['kind'], d['as'], d['mechanism'], d['count'])
             for d in r['same_as_written']}  # fmt: skip
    assert named == {(t, 'all-reduce', 'reduce-scatter', 'sliced', 5) for t in ('auto', 'typed')}
    assert r['surprises'] == {'one_device': [], 'auto': [], 'explicit': [], 'typed': []}
    assert {v['verdict'] for v in r['expected_vs_compiled']} == {'matches'}


def test_the_wrong_shard_is_still_a_difference(monkeypatch):
    """The bug zoo's zero1_wrong_shard as explicit/: its collective-permute of each scattered
    shard over 'data' is a difference against auto/ and typed/ and their surprise; the
    reduce-scatters they share are still named."""
    r = report(module=zero1_wrong_shard, monkeypatch=monkeypatch)
    for twin in ('auto', 'typed'):
        kinds = {d['kind'] for d in r['difference_lines'] if twin in (d['twin'], d['sibling'])}
        assert kinds == {'collective-permute'}, r['difference_lines']
        assert 'twin-difference' in {s['kind'] for s in r['surprises'][twin]}
    assert {d['twin'] for d in r['same_as_written']} == {'auto', 'typed'}


# what stays a difference on data:4,model:2: auto's embedding lookup's backward (docs/zero1.md)
AUTO_LEFT = {('auto', 'collective-permute', 8), ('auto', 'all-gather', 2),
             ('auto', 'all-reduce', 2)}  # fmt: skip


@pytest.mark.slow
def test_the_transformers_layers_read_as_one_step():
    """The tiny transformer on data:4,model:2: explicit/ scatters each stacked gradient whole
    (10 operands); auto/ reduces 14 layer pieces where the backward forms them (and scatters
    the position embedding's into zeros of its rows), typed/ stacks 4 [32] vectors before
    slicing: all named as explicit's reduce-scatter, typed/ no difference. What stays one on
    auto/ is none of the reduction over 'data': the embedding lookup's backward resharded
    over (data, model) and its 64-row slice summed over 'model' (docs/zero1.md)."""
    r = report('transformer', 'data:4,model:2')
    assert r['typed_differences'] == [], r['difference_lines']
    left = {(d['twin'], d['kind'], d['group_size']) for d in r['difference_lines']}
    assert left == AUTO_LEFT, r['difference_lines']
    for twin, count, layers in (('auto', 17, 14), ('typed', 12, 4)):
        named = [d for d in r['same_as_written'] if d['twin'] == twin]
        assert sum(d['count'] for d in named) == count and {d['as'] for d in named} == {
            'reduce-scatter'}
        assert sum(d['layers'] for d in named) == layers
    for twin, how in (('auto', 'into zeros of that size'), ('typed', 'cut from the stack')):
        assert any(how in p['reason'] for op in r['programs'][twin] for p in op['stands_for'])


@pytest.mark.slow
def test_the_pipelines_reduction_in_its_loop_is_named_with_its_trips():
    """data:2,model:2,stage:2 (4 microbatches, 5 ticks): auto/ and typed/ all-reduce the blocks'
    gradients once per tick inside the ticks' loop (auto/ slicing each tick's, typed/ the sum
    the loop hands out), named as explicit's reduce-scatter with 'runs x5', the
    reduction-per-iteration surprise still raised; typed/ no difference. auto/ reduces the tied
    embedding's two terms, each its [128, 32] half by 'model', over 'data' and permutes them
    to their owners: explicit's [128, 32] reduce-scatter stays a difference."""
    r = report('transformer', 'data:2,model:2,stage:2', batch=16, microbatches=4)
    assert r['typed_differences'] == [], r['difference_lines']
    for twin in ('auto', 'typed'):
        looped = [d for d in r['same_as_written'] if d['twin'] == twin and d['trips'] > 1]
        assert [(d['trips'], d['sibling_trips'], d['count']) for d in looped] == [(5, 1, 7)]
        assert "runs x5 a step (once per iteration of a loop) where explicit's runs x1" in (
            looped[0]['what'])
        assert 'reduction-per-iteration' in {s['kind'] for s in r['surprises'][twin]}
    assert 'of the sum it adds up over the loop' in next(
        d['reason'] for d in r['same_as_written'] if d['twin'] == 'typed' and d['trips'] > 1)
    scatters = [d for d in r['differences'] if d.startswith('explicit has reduce-scatter')]
    embedding = 'explicit has reduce-scatter of 4,096 elements over 2 devices that auto lacks (x1)'
    assert scatters == [embedding], r['differences']


@pytest.mark.slow
@pytest.mark.skipif(not libtpu_installed(), reason='libtpu is not installed')
def test_the_transformer_for_a_tpu():
    """--target=tpu-v5e-8, data:4,model:2: the TPU compiler stacks typed's [32] vectors as pads
    of -inf joined by maximum, read as the stack it is; typed/ no difference, auto/ only what
    it has on the CPU (the embedding lookup's backward)."""
    r = report('transformer', 'data:4,model:2', target='tpu-v5e-8')
    assert r['typed_differences'] == [], r['difference_lines']
    left = {(d['twin'], d['kind'], d['group_size']) for d in r['difference_lines']}
    assert left == AUTO_LEFT, r['difference_lines']
    assert any('cut from the stack' in p['reason'] for op in r['programs']['typed']
               for p in op['stands_for'])  # fmt: skip
