"""What a program asks its backend to move, beside what the compiled program carries: the
collectives of the program as the SPMD partitioner leaves it (the written ones and those it
inserted, in the element types the step gave them), before the backend's own passes. XLA:CPU
has no bf16 collective: its all-reduce-promotion pass carries a bf16 all-reduce or
reduce-scatter in f32, and float-normalization-bf16 an all-gather, all-to-all or
collective-permute (convert -> f32 collective -> convert); later passes fuse or drop those
converts, so the optimized text alone cannot say what was asked. A TPU's compiler may narrow
what it moves (inspector/mechanisms.py, `narrowed`) or reduce a widened value in the narrow type.

The partitioned program is read from the one compile the inspector runs: XLA writes it for
that one pass (--xla_dump_to, as compile options) into a folder that is read and deleted
(`dumping`). `compare` gives each compiled collective's operands the dtypes asked for them,
matched by kind, mesh axes, phase and elements, and says why a carried dtype differs.
"""

import contextlib
import glob
import os
import shutil
import tempfile

import numpy as np

from .attribute import attribute
from .hlo import logical
from .hlo_module import ITEMSIZE, Module

PASS = 'spmd-partitioning'  # XLA:CPU's and GPU's pass; a TPU's is tpu-spmd-partitioning
REDUCTIONS = ('all-reduce', 'reduce-scatter')


@contextlib.contextmanager
def dumping():
    """(compile options, read): the options make a compile write its partitioned program into
    a folder of its own; read() returns that program's text ('' when none was written) and
    deletes the folder. `xla_dump_large_constants` is set because it is part of JAX's
    persistent cache key (the dump options are not): a compile with these options never reuses
    an executable compiled without them, whose compile wrote nothing."""
    folder = tempfile.mkdtemp(prefix='inspector-asked-')
    options = {'xla_dump_to': folder, 'xla_dump_hlo_pass_re': PASS,
               'xla_dump_hlo_as_text': True, 'xla_dump_large_constants': True}  # fmt: skip

    def read() -> str:
        found = sorted(glob.glob(os.path.join(folder, f'*after_*{PASS}*.txt')))
        return open(found[-1]).read() if found else ''

    try:
        yield options, read
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def collectives(text: str, mesh) -> list[dict]:
    """The partitioned program's collectives: kind, shapes, dtypes, mesh axes, phase, line."""
    if not text:
        return []
    module = Module(text)
    out = []
    for found, where in zip(logical(module), attribute(text, mesh, module)):
        c = found.collective
        out.append({
            'kind': c.kind, 'shapes': [list(s) for s in c.shapes], 'dtypes': list(c.dtypes),
            'bytes': c.bytes, 'axes': where['axes'], 'phase': where['phase'],
            'file': where['file'], 'line': where['line'],
        })  # fmt: skip
    return out


def written_kinds(op: dict) -> list[str]:
    """Per operand, the kind of collective it does the work of: a part the op `stands_for` (a
    TPU's all-gather done as an all-reduce, a reduce-scatter as an all-reduce and a slice), or
    the op's own kind."""
    kinds = [op['kind']] * len(op['shapes'])
    for part in op.get('stands_for', []):
        kinds[part.get('operand', 0)] = part['kind']
    return kinds


def _keys(kind, op, elements) -> tuple[tuple, tuple]:
    """(kind, mesh axes, phase, elements), and (kind, elements) for an operand whose axes or
    phase the compiler's passes changed."""
    return (kind, tuple(op['axes'] or ()), op['phase'], elements), (kind, elements)


def _wanted_keys(n, kind, op) -> list[tuple]:
    """The keys an asked operand may have for compiled operand n, best first: of the kind it
    does the work of (`written_kinds`; a reduce-scatter done as an all-reduce and a slice, or
    padded, with its slice's elements), of the compiled op's kind, and for a reduce-scatter of
    an all-reduce of the whole (each device then keeping its slice), which XLA:CPU's
    reduce-scatter-creator pass makes into one."""
    elements = int(np.prod(op['shapes'][n]))
    cut = [p for p in op.get('stands_for', [])
           if p.get('operand', 0) == n and p['mechanism'] in ('padded', 'sliced')]  # fmt: skip
    written = cut[0]['bytes'] // ITEMSIZE[op['dtypes'][n]] if cut else elements
    kinds = dict.fromkeys([(kind, written), (op['kind'], elements)])
    if kind == 'reduce-scatter' and op['kind'] != 'all-reduce':
        kinds[('all-reduce', written * op['group_size'])] = None
    keys = [_keys(k, op, e) for k, e in kinds]
    return [k[0] for k in keys] + [k[1] for k in keys]


def _take(left: list, keys: list[tuple], carried: str):
    """The first asked operand left under the first of `keys` that has one (an asked dtype
    equal to the carried one first), removed from `left`; None where no key has one."""
    for key in keys:
        if found := [e for e in left if key in e[:2]]:
            pick = next((e for e in found if e[2] == carried), found[0])
            left.remove(pick)
            return pick[2]
    return None


def compare(ops: list[dict], asked_ops: list[dict], backend: str) -> None:
    """Sets each compiled op's `asked` (per operand: the dtype the partitioned program gives an
    operand of its kind, mesh axes, phase and elements, or failing those of its kind and
    elements; None where none is left) and `asked_by` and `asked_why` (per operand: what
    changed the carried dtype and why, '' where nothing did: `why`). Operands of one key are
    matched as a multiset. An operand a backend promoted stands for the collective in its asked
    dtype (`promoted`)."""
    left = [
        (*_keys(a['kind'], a, int(np.prod(shape))), dtype)
        for a in asked_ops for shape, dtype in zip(a['shapes'], a['dtypes'])
    ]  # fmt: skip
    for op in ops:
        kinds = written_kinds(op)
        op['asked'] = [_take(left, _wanted_keys(n, kind, op), carried)
                       for n, (kind, carried) in enumerate(zip(kinds, op['dtypes']))]  # fmt: skip
        # a narrowing the step asked for itself (its cast to --dtype, moved by the compiler
        # next to the collective) is no mechanism of the compiler's
        op['stands_for'] = [p for p in op.get('stands_for', []) if p['mechanism'] != 'narrowed'
                            or op['asked'][p['operand']] != op['dtypes'][p['operand']]]  # fmt: skip
        if None in op['asked'] and len(op['shapes']) > 1:
            # XLA:CPU's all-to-all decomposer splits one into a piece per device
            whole = sum(int(np.prod(s)) for s in op['shapes'])
            found = _take(left, list(_keys(op['kind'], op, whole)), op['dtypes'][0])
            op['asked'] = [a or found for a in op['asked']]
        changed = [why(op, n, kind, asked, carried, backend) for n, (kind, asked, carried)
                   in enumerate(zip(kinds, op['asked'], op['dtypes']))]  # fmt: skip
        op['asked_by'] = [by for by, _ in changed]
        op['asked_why'] = [text for _, text in changed]
        for n, (by, text) in enumerate(changed):
            if by == 'promoted':
                promoted(op, n, kinds[n], text)


def promoted(op: dict, n: int, kind: str, reason: str) -> None:
    """Counts operand n, which a backend carries wider than asked, as the collective it stands
    for in `stands_for` (what inspector/reconcile.py holds against the expectation): at its
    asked bytes, within the part another mechanism already made of it, or as a part of its
    own (mechanism 'promoted')."""
    ratio = (ITEMSIZE[op['asked'][n]], ITEMSIZE[op['dtypes'][n]])
    parts = op.setdefault('stands_for', [])
    part = next((p for p in parts if p.get('operand', 0) == n), None)
    if part is not None:
        part['bytes'] = part['bytes'] * ratio[0] // ratio[1]
        part['reason'] += f'; {reason}'
        return
    each = int(np.prod(op['shapes'][n])) * ratio[1]
    parts.append({'kind': kind, 'compiled_bytes': each, 'bytes': each * ratio[0] // ratio[1],
                  'mechanism': 'promoted', 'reason': reason, 'operand': n})  # fmt: skip


def why(op: dict, n: int, kind: str, asked: str | None, carried: str,
        backend: str) -> tuple[str, str]:  # fmt: skip
    """(what changed it, why) operand n is carried in another dtype than asked: 'promoted' by
    a backend pass, 'narrowed' for a dot (inspector/mechanisms.py), 'compiler' for a narrowing
    no mechanism found accounts for; ('', '') where it is the same or nothing was asked."""
    part = next((p for p in op.get('stands_for', []) if p.get('operand', 0) == n
                 and p['mechanism'] == 'narrowed'), None)  # fmt: skip
    if asked == carried or asked is None and part is None:
        return '', ''
    if asked is not None and ITEMSIZE[carried] > ITEMSIZE[asked]:  # widened by the backend
        if backend == 'cpu':
            pass_ = 'all-reduce-promotion' if kind in REDUCTIONS else 'float-normalization-bf16'
            return 'promoted', (f'XLA:CPU carries {asked} {kind}s in {carried}: its {pass_} pass '
                                f'converts the operand to {carried} before the {kind} and the '
                                'result back after')  # fmt: skip
        return 'promoted', f'the {backend} backend carries the {asked} {kind} in {carried}'
    if part is not None:
        return 'narrowed', part['reason']
    return 'compiler', (
        f'asked in {asked}, carried in {carried}: the compiler narrowed it after '
        'partitioning, and no mechanism found in the program accounts for it'
    )
