"""Claim: the inspector reads what XLA prints, in every spelling the supported JAX versions use
(replica groups as lists, iota and mesh; source lines inline and as a stack-frame table), prices
collectives by the ring formulas with a latency floor, and catches the partitioner's warnings
that XLA writes below Python; it reads a TPU's program as the chip runs it (async collective
chains once each, all-reduce-scatter fusions as reduce-scatters, loop trips from the condition);
its generic part imports nothing of this project. No program is compiled here: the inputs are
XLA's own text (parity_tests/hlo/: programs the TPU compiler printed, captured with libtpu
0.0.42.1 and jax 0.10.2 for tpu-v5e-8 by `python -m inspector --target=tpu-v5e-8`, and a toy
FSDP step the GPU compiler printed for 8 H200s, deviceless, from a hand-written target config)."""

import ast
import collections
import gzip
import os
import pathlib
import re

import jax
import pytest
from jax.sharding import AxisType

from shard_parity import inspector
from shard_parity.inspector import cost, surprises
from shard_parity.inspector.attribute import mesh_axes
from shard_parity.inspector.hlo import device_groups, logical
from shard_parity.inspector import reconcile
from shard_parity.inspector.hlo_module import Module
from shard_parity.inspector.mechanisms import stands_for
from shard_parity.inspector.program import captured_stderr

# inspector/__init__.py: what inspects any jitted program, apart from what knows the twins
GENERIC = {'program', 'hlo', 'hlo_module', 'mechanisms', 'dataflow', 'attribute', 'cost',
           'surprises', 'render', 'html', 'trace', 'target', 'target_figures', 'hosts',
           'reconcile', 'asked', 'slices'}  # fmt: skip
# what a generic module may take of the package: its one exception, and libtpu's quieting (the
# core's device set-up, which imports nothing of the project either)
ALLOWED = {
    ('shard_parity', ('UsageError',)),
    ('shard_parity.devices', ('libtpu_installed', 'quiet_libtpu')),
}
PROJECT = {'shard_parity', 'auto', 'explicit', 'typed', 'tools', 'parity_tests', 'datasets'}


def project_imports(source: str) -> set[str]:
    """What `source` imports of this project other than the generic inspector modules."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split('.')[0] in PROJECT}
        elif isinstance(node, ast.ImportFrom) and node.level:  # from . import x, from .x import y
            names = [node.module] if node.module else [a.name for a in node.names]
            found |= {f'.{n}' for n in names if n.split('.')[0] not in GENERIC}
        elif isinstance(node, ast.ImportFrom) and node.module.split('.')[0] in PROJECT:
            if (node.module, tuple(a.name for a in node.names)) not in ALLOWED:
                found.add(node.module)
    return found


def test_the_generic_inspector_imports_nothing_of_the_twins():
    planted = 'from . import cost\nfrom .twins import inspect\nfrom shard_parity.mesh import DATA'
    assert project_imports(planted) == {'.twins', 'shard_parity.mesh'}  # the check can fail
    folder = pathlib.Path(inspector.__file__).parent
    for name in sorted(GENERIC):
        assert project_imports((folder / f'{name}.py').read_text()) == set(), name


def test_replica_groups_in_all_three_spellings_name_the_same_axes():
    mesh = jax.make_mesh((4, 2), ('data', 'model'), axis_types=(AxisType.Auto,) * 2)
    over_model = [[0, 1], [2, 3], [4, 5], [6, 7]]
    over_data = [[0, 2, 4, 6], [1, 3, 5, 7]]
    spellings = {
        '{{0,1},{2,3},{4,5},{6,7}}': over_model,
        '[4,2]<=[8]': over_model,
        "mesh['axis_0'=4,'axis_1'=2] {'axis_1'}": over_model,
        '{{0,2,4,6},{1,3,5,7}}': over_data,
        '[2,4]<=[4,2]T(1,0)': over_data,
        "mesh['axis_0'=4,'axis_1'=2] {'axis_0'}": over_data,
        "mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_1'}": over_data,
        '[1,8]<=[8]': [list(range(8))],
    }
    axes = {id(over_model): ['model'], id(over_data): ['data']}
    for text, groups in spellings.items():
        assert device_groups(text) == groups, text
        assert mesh_axes(text, '', mesh) == axes.get(id(groups), ['data', 'model']), text
    assert mesh_axes('pairs={{0,2},{2,4},{4,6},{6,0}}', '', mesh) == ['data']
    assert mesh_axes('{{0,2},{4,6},{1,3},{5,7}}', '', mesh) == ['data~2']  # half of 'data'


OLD_FORMAT = """HloModule m
ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %all-reduce = f32[8]{0} all-reduce(%p), replica_groups={{0,1}}, to_apply=%add, \
metadata={op_name="jit(f)/psum" source_file="/home/me/mine.py" source_line=12}
}
"""
NEW_FORMAT = (
    OLD_FORMAT.replace('source_file="/home/me/mine.py" source_line=12', 'stack_frame_id=3')
    + """
FileNames
1 "/home/me/mine.py"
2 "/usr/lib/python3.11/site-packages/jax/_src/lax/parallel.py"

FunctionNames
1 "main"
2 "step"
3 "psum"

FileLocations
1 {file_name_id=1 function_name_id=1 line=40 end_line=40 column=1 end_column=1}
2 {file_name_id=1 function_name_id=2 line=12 end_line=12 column=1 end_column=1}
3 {file_name_id=2 function_name_id=3 line=99 end_line=99 column=1 end_column=1}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}
3 {file_location_id=3 parent_frame_id=3}
"""
)


def test_both_metadata_spellings_give_the_users_line():
    for text in (OLD_FORMAT, NEW_FORMAT):
        m = Module(text)
        (op,) = inspector.attribute.attribute(text, None, m)
        assert (op['file'], op['line']) == ('/home/me/mine.py', 12), text
    # the new table: innermost first, each frame's parent printed as its id + 1 (1: none)
    frames = Module(NEW_FORMAT).frames(3)
    assert [(f.line, f.function) for f in frames] == [(99, 'psum'), (12, 'step'), (40, 'main')]


def test_ring_formulas_and_latency_floor():
    h = cost.HARDWARE['h100x8']
    bw = h.link_gb_s * 1e9 * h.achievable
    gb = 1e9
    assert cost.collective_us('all-gather', gb, 8, h) == pytest.approx(
        7 * h.hop_us + gb * 7 / 8 / bw * 1e6
    )
    assert cost.collective_us('all-reduce', gb, 8, h) == pytest.approx(
        2 * cost.collective_us('all-gather', gb, 8, h)
    )
    # reduce-scatter's result is 1/n of the array: the same wire bytes as gathering it back
    assert cost.collective_us('reduce-scatter', gb / 8, 8, h) == pytest.approx(
        cost.collective_us('all-gather', gb, 8, h)
    )
    assert cost.collective_us('collective-permute', gb, 8, h) == pytest.approx(
        h.hop_us + gb / bw * 1e6
    )
    assert cost.collective_us('all-reduce', 4, 8, h) == pytest.approx(14 * h.hop_us, rel=1e-3)
    assert cost.collective_us('all-reduce', gb, 1, h) == 0
    assert cost.step_band(3.0, 5.0) == (5.0, 8.0)
    for hw in cost.HARDWARE.values():
        assert hw.sources and 0 < hw.achievable <= 1


def test_compile_warnings_are_captured_and_attached_to_their_op():
    logs = []
    with captured_stderr(logs):
        os.write(2, b'W xla: [SPMD] Involuntary full rematerialization. The compiler cannot go '
                    b'from sharding {devices=[8]<=[8]} to {replicated} efficiently for HLO '
                    b'operation %dot.3 = f32[8,8] dot(%a, %b), metadata={op_name="jit(f)/dot" '
                    b'source_file="/home/me/mine.py" source_line=7}\n')  # fmt: skip
    (w,) = surprises.remat_warnings(logs[0])
    assert (w['op_name'], w['file'], w['line']) == ('jit(f)/dot', '/home/me/mine.py', 7)
    op = {'name': 'all-gather.1', 'kind': 'all-gather', 'op_name': 'jit(f)/dot', 'file': 'mine.py',
          'line': 7, 'axes': ['data'], 'shapes': [[8, 8]], 'origin': 'partitioner'}  # fmt: skip
    found = surprises.program_surprises({'ops': [op], 'warnings': [w]}, [])
    assert [s['kind'] for s in found] == ['involuntary-remat'] and op['flags'] == [
        'involuntary-remat'
    ]
    assert surprises.program_surprises({'ops': [dict(op, flags=[])], 'warnings': []}, []) == []


def tpu_text(name: str) -> str:
    return gzip.open(pathlib.Path(__file__).parent / 'hlo' / f'{name}.txt.gz', 'rt').read()


def test_a_tpu_programs_async_chains_and_fused_reduce_scatters_count_once():
    # auto/fsdp.py's MLP step as the v5e compiler built it
    text = tpu_text('tpu_v5e8_mlp_fsdp_auto')
    m = Module(text)
    found = logical(m)
    # the text prints each async gather in its start, continuation (the matmul that consumes
    # it) and done fusions: 10 all-gather lines where the step runs 5 gathers
    assert len([i for i in m.instructions.values() if i.opcode == 'all-gather']) == 10
    kinds = collections.Counter((f.collective.kind, f.collective.dtypes[0], f.asynchronous)
                                for f in found)  # fmt: skip
    assert kinds == {
        ('all-gather', 'bf16', True): 2,  # the 512x512 weight forward, 128x512 rows backward
        ('all-gather', 'bf16', False): 3,
        ('reduce-scatter', 'f32', False): 1,  # the gradients: an all-reduce-scatter fusion
        ('all-reduce', 'f32', False): 2,
        ('all-to-all', 'f32', False): 2,
        ('collective-permute', 'f32', True): 1,
    }
    ops = {(f.collective.kind, f.asynchronous): f for f in found}
    fused = ops['reduce-scatter', False]
    # each device's slices of the two weights' gradients (784 rows tiled to 832: 104 a device),
    # not the whole padded sum the fusion's all-reduce prints
    assert fused.fused_as == 'all-reduce-scatter'
    assert fused.collective.shapes == ((104, 512), (64, 512))
    assert fused.collective.bytes == (104 + 64) * 512 * 4
    # collective-permute-start's type is (operand, result, two u32 contexts): the bytes are
    # the done's, one f32[42,512]
    assert ops['collective-permute', True].collective.bytes == 42 * 512 * 4
    gather = next(f for f in found if f.collective.shapes == ((512, 512),))
    assert gather.asynchronous and gather.collective.dtypes == ('bf16',)
    assert 'matmul' in [what for _, what in gather.between]  # overlapped by the consuming matmul
    where = inspector.attribute.attribute(text, None, m)
    (line,) = {o['line'] for f, o in zip(found, where) if f.collective.kind == 'reduce-scatter'}
    assert line == 81  # the fusion's own metadata: ops.py's product (its backward)


def test_a_tpu_loop_is_counted_by_its_condition():
    # explicit/fsdp.py's 101M transformer: the 8 layers under a scan, without known_trip_count
    text = tpu_text('tpu_v5e8_transformer101m_fsdp_explicit')
    assert 'known_trip_count' not in text and text.count(' while(') == 2
    m = Module(text)
    assert {n for n, how in m.trips.values()} == {8} and not m.unknown_trip
    ops = zip(logical(m), inspector.attribute.attribute(text, None, m))
    per_layer = [f.collective for f, o in ops if o['trip_count'] == 8]
    assert {c.kind for c in per_layer} == {'all-gather', 'reduce-scatter', 'all-reduce'}
    # the weights are gathered in bf16 (XLA moved the f32 -> bf16 convert before the
    # hand-written f32 all_gather), the gradients reduce-scattered in f32
    big = [c for c in per_layer if c.bytes >= 2**21]
    assert {(c.kind, c.dtypes[0]) for c in big} == {('all-gather', 'bf16'),
                                                   ('reduce-scatter', 'f32')}  # fmt: skip
    # the TPU prints matmuls as convolutions: the loop-body FLOPs are found in them
    body = next(c for c in m.computations if m.multiplier[c] == 8 and m.dot_flops(c) > 0)
    assert m.dot_flops(body) > 1e9


def test_a_gpus_start_done_pairs_count_their_result_once():
    # a GPU prints async collectives as -start/-done ops; the start's type is (operand, result)
    text = tpu_text('gpu_h200x8_fsdp_toy')
    assert '(f32[128,1024]{1,0}, f32[1024,1024]{1,0}) all-gather-start(' in text
    found = logical(Module(text))
    assert [(f.collective.kind, f.asynchronous) for f in found] == [
        ('all-gather', True), ('reduce-scatter', True)
    ]
    gather, scatter = (f.collective for f in found)
    assert gather.shapes == ((1024, 1024),) and gather.bytes == 1024 * 1024 * 4  # not + operand
    assert scatter.shapes == ((128, 1024),) and scatter.bytes == 128 * 1024 * 4


def stood_for(text: str) -> dict:
    """{collective name: its parts' (kind, compiled bytes, bytes as written, mechanism)}."""
    m = Module(text)
    return {f.name: [(p['kind'], p['compiled_bytes'], p['bytes'], p['mechanism'])
                     for p in stands_for(m, f)] for f in logical(m)}  # fmt: skip


def test_what_a_tpu_made_of_each_written_collective_is_read_from_its_program():
    """auto/fsdp.py's MLP step as the v5e compiler built it: each mechanism found in the text.
    The weights gathered in bf16 (f32 converted for a DEFAULT-precision matmul) stand for f32
    gathers; the biases' gather is an all-reduce of zero-padded shards; the gradients of the
    biases and of the 512x10 weight are all-reduced whole and sliced (the 10-element bias, which
    8 devices cannot split, is a true all-reduce); the 784-row gradient is padded to 832 rows
    for the fused reduce-scatter, whose permute only moves rows back to their owners."""
    text = tpu_text('tpu_v5e8_mlp_fsdp_auto')
    parts = stood_for(text)
    gather = parts['async-collective-start']  # the 512x512 weight, in bf16
    assert gather == [('all-gather', 512 * 512 * 2, 512 * 512 * 4, 'narrowed')]
    assert parts['all-reduce.16'] == [('all-gather', 2048, 2048, 'zero-padded')] * 2
    assert parts['all-reduce.15'] == [('reduce-scatter', 2048, 256, 'sliced')] * 2 + [
        ('reduce-scatter', 512 * 10 * 4, 64 * 10 * 4, 'sliced')
    ]  # the f32[10] bias and the metric scalars stand for themselves
    assert parts['fusion.31'] == [('reduce-scatter', 104 * 512 * 4, 784 * 512 * 4 // 8, 'padded')]
    assert parts['collective-permute-start'] == [('reduce-scatter', 42 * 512 * 4, 0, 'padded')]
    assert parts['all-to-all'] == []  # nothing found: it stands for itself
    reason = stands_for(Module(text), next(f for f in logical(Module(text))
                                           if f.name == 'async-collective-start'))[0]['reason']
    assert '%convert.3' in reason and 'DEFAULT matmul precision (%convolution' in reason
    # the checks can fail: a cast the program wrote, or a dot at HIGHEST precision, is no
    # compiler's bf16 gather
    cast = r'\1, metadata={op_name="jit(step)/convert_element_type"}'
    own = re.sub(r'(%convert\.3 = [^\n]*?\))', cast, text, count=1)
    assert own != text and stood_for(own)['async-collective-start'] == []
    exact = r'\1, operand_precision={highest,highest}'
    highest = re.sub(r'(%convolution\.8 = [^\n]*?dim_labels=\S+)', exact, text, count=1)
    assert highest != text
    assert stood_for(highest)['async-collective-start'] == []


def test_a_tpus_narrowing_copy_counts_as_the_convert():
    # explicit/fsdp.py's 101M transformer: every bf16 gather of a layer's f32 weights stands for
    # its f32 gather, those converted by a copy (layout change and narrowing in one op) too
    parts = stood_for(tpu_text('tpu_v5e8_transformer101m_fsdp_explicit'))
    m = Module(tpu_text('tpu_v5e8_transformer101m_fsdp_explicit'))
    bf16 = [f.name for f in logical(m) if f.collective.dtypes == ('bf16',)]
    assert len(bf16) == 10 and all(parts[n][0][3] == 'narrowed' for n in bf16)
    assert all(parts[n][0][2] == 2 * parts[n][0][1] for n in bf16)


def test_a_row_is_explained_only_by_the_mechanisms_its_ops_carry():
    """reconcile.rows: the expected bytes against the compiled ones, then against the bytes as
    written; a difference no part accounts for stays a surprise."""
    record = {'kind': 'all-gather', 'axes': ['fsdp'], 'phase': 'forward', 'twins': ['explicit'],
              'total': 4096, 'piece': 'fsdp'}  # fmt: skip
    op = {'name': 'ag', 'kind': 'all-gather', 'axes': ['fsdp'], 'phase': 'forward',
          'shapes': [[1024]], 'dtypes': ['bf16'], 'trip_count': 1}  # fmt: skip
    (row,) = reconcile.rows([record], [op])
    assert (row['compiled'], row['verdict']) == (2048, 'differs')
    assert reconcile.surprises([row])[0]['kind'] == 'unexplained-bytes'
    part = {'kind': 'all-gather', 'compiled_bytes': 2048, 'bytes': 4096, 'mechanism': 'narrowed',
            'reason': 'f32 values moved in bf16'}  # fmt: skip
    (row,) = reconcile.rows([record], [op | {'stands_for': [part]}])
    assert (row['as_written'], row['verdict']) == (4096, 'explained')
    assert row['reasons'] == ['ag: f32 values moved in bf16'] and not reconcile.surprises([row])
    # a part that accounts for other bytes explains nothing
    (row,) = reconcile.rows([record], [op | {'stands_for': [part | {'bytes': 3000}]}])
    assert row['verdict'] == 'differs'
    (row,) = reconcile.rows([record], [op | {'shapes': [[1024]], 'dtypes': ['f32']}])
    assert row['verdict'] == 'matches' and row['reasons'] == []
