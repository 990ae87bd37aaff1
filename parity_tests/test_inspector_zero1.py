"""Claim: under ZeRO-1 (--shard_optimizer_over_data, docs/zero1.md) the inspector reads the three
twins' programs on the CPU as the same step. XLA:CPU forms no reduce-scatter from an all-reduce
and a slice, so auto/ and typed/, which leave the `zero1` piece's reduce-scatter over 'data' to
the compiler, compile it as an all-reduce of each whole gradient, each device then keeping its
1/n (inspector/mechanisms.py's `sliced`); explicit/ writes psum_scatter. The twins' comparison
counts that form as the reduce-scatter it does the work of (inspector/twins.py, `written_forms`)
and names it with its mechanism (`same_as_written`), no twin difference. A real difference stays
one: a reduce-scatter explicit/ writes that the other twin lacks, a missing all-gather of the
params, the bug zoo's zero1_wrong_shard (a collective-permute of each shard). Compile only."""

import copy
import json

import jax
from jax.sharding import AxisType

from parity_tests.helpers import TINY_TRANSFORMER
from shard_parity import config as cfg
from shard_parity import explicit
from shard_parity import plan as plans
from shard_parity.inspector import twins
from shard_parity.mesh import mesh_for
from shard_parity.tools.zoo import zero1_wrong_shard

ZERO1 = frozenset({('sliced', 'reduce-scatter', ('data',))})
# The MLP's split gradients ([784, 512], [512], [512, 512], [512], [512, 10]), 1/8 of each kept
SPLIT = [(784, 512), (512,), (512, 512), (512,), (512, 10)]


def op(kind, shapes, stands_for=(), line=1, axes=('data',)):
    return {'kind': kind, 'group_size': 8, 'shapes': [list(s) for s in shapes],
            'axes': list(axes), 'stands_for': list(stands_for), 'file': f'{kind}.py',
            'line': line, 'flags': []}  # fmt: skip


def sliced(n, shape):
    return {'kind': 'reduce-scatter', 'mechanism': 'sliced', 'operand': n,
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
    assert len(twins.difference_lines(p, 'auto')) == 2  # the comparison can fail
    assert twins.difference_lines(p, 'auto', ZERO1) == []
    assert twins.differences(p['auto'], p['explicit'], 'auto', ZERO1) == []
    (named,) = twins.named_lines(p, 'auto', ZERO1)
    assert (named['twin'], named['kind'], named['as'], named['count']) == (
        'auto', 'all-reduce', 'reduce-scatter', 5)
    assert named['mechanism'] == 'sliced' and named['sibling_lines'] == ['reduce-scatter.py:22']
    assert "are explicit's reduce-scatter" in named['what'] and 'sliced' in named['what']
    assert twins.named_lines(p, 'auto') == []  # no form: nothing named


def test_a_real_difference_is_still_reported():
    """A reduce-scatter explicit writes that auto lacks (auto slices one gradient fewer, and
    all-reduces it whole), a missing all-gather of the params, an extra collective: each stays
    a difference, flagged on the op; only the operands that match are named."""
    p = programs(auto_split=SPLIT[1:], gathers=True)
    p['auto'][0]['shapes'].insert(0, list(SPLIT[0]))  # [784, 512] all-reduced, kept whole
    p['auto'][0]['stands_for'] = [sliced(n + 1, s) for n, s in enumerate(SPLIT[1:])]
    lines = twins.difference_lines(p, 'auto', ZERO1)
    assert {(d['twin'], d['kind']) for d in lines} == {
        ('auto', 'all-reduce'), ('explicit', 'reduce-scatter')}
    (named,) = twins.named_lines(p, 'auto', ZERO1)
    assert named['count'] == 4
    twins.mark_differences(p, lines, ZERO1)
    assert 'twin-difference' in p['auto'][0]['flags']

    p = programs(gathers=False)
    found = twins.differences(p['auto'], p['explicit'], 'auto', ZERO1)
    assert len(found) == 4 and all(d.startswith('explicit has all-gather of') for d in found)
    assert 'explicit has all-gather of 401,408 elements over 8 devices that auto lacks (x1)' in (
        found)
    p = programs(extra=[op('collective-permute', [eighth(SPLIT[0])], line=7)])
    assert [d['kind'] for d in twins.difference_lines(p, 'auto', ZERO1)] == ['collective-permute']


def test_only_zero1_names_the_form():
    """The form is ZeRO-1's: FSDP's reduce-scatter compiled the same way stays a difference
    (docs/inspector.md), and a 'sliced' part over another axis is not named."""
    assert twins.written_forms(plans.parse('data:8', None, 8, zero1=True)) == ZERO1
    assert twins.written_forms(plans.parse(None, 'fsdp', 8)) == frozenset()
    p = programs()
    for o in p['auto']:
        o['axes'] = ['fsdp']
    assert twins.named_lines(p, 'auto', ZERO1) == []
    assert twins.difference_lines(p, 'auto', ZERO1)


def report(model='mlp', text='data:8', module=None, monkeypatch=None):
    """The inspector over the twins' ZeRO-1 step on the CPU (`module`: explicit/'s file
    replaced by it, as tools.bisect --twins runs a zoo entry), as its --json prints it."""
    plan = plans.parse(text, None, jax.device_count(), zero1=True)
    mesh = mesh_for(plan, AxisType.Auto, devices=jax.devices())
    if module is not None:
        chosen = twins.strategy_file
        monkeypatch.setattr(twins, 'strategy_file',
                            lambda twin, plan: module if twin is explicit else chosen(twin, plan))
    r = twins.inspect(model, cfg.TRAIN_DEFAULTS[model], mesh, plan, TINY_TRANSFORMER)
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
