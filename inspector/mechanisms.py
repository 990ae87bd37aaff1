"""What a compiler made of a collective the program wrote, read back from the optimized HLO: the
written collective each compiled one stands for, and the mechanism, checked in that program, by
which its bytes or its kind differ from what was written. A TPU's compiler, for example:

    narrowed     f32 values converted to bf16 before the collective, where the only use of the
                 result is a dot at DEFAULT matmul precision (one bf16 pass on a TPU): a convert
                 the compiler inserted (no `convert_element_type` of the program's) feeds the
                 collective, and its result reaches a dot or convolution without a precision
                 of its own; it stands for the f32 collective, twice its bytes
    zero-padded  an all-gather done as an all-reduce: each device's shard written at its offset
                 into a zeroed buffer of the whole (dynamic-update-slice into a broadcast zero),
                 then summed; it stands for the all-gather of the whole
    sliced       a reduce-scatter done as an all-reduce of the whole, each device then keeping
                 only its 1/n slice (every use a dynamic-slice of 1/n of it, or a scatter of it
                 into zeros of 1/n its size, or a concatenate stacking it with the other
                 layers' pieces, every use of which slices 1/n of the stack); it stands for
                 the reduce-scatter of that slice (`shape`: what each device keeps of it)
    reassociated two all-reduces of partial sums added afterwards, done as one all-reduce of
                 their sum: psum(a) + psum(b) = psum(a + b) (XLA's all-reduce reassociation),
                 where the operand is an add of two dot products (a backward's gradients of one
                 input from its two uses); it stands for the two all-reduces
    padded       an all-reduce and a slice fused into a reduce-scatter (`all-reduce-scatter`)
                 whose operand was padded (a `pad` op) so that it splits into the devices' tiles:
                 it stands for the reduce-scatter of the unpadded operand; a collective-permute
                 of rows sliced from its result (to the devices that own them, the padding
                 having shifted each device's tile) stands for no collective of its own
    promoted     (inspector/asked.py adds it, from the partitioned program) an operand the
                 backend carries wider than the step asked (XLA:CPU: bf16 in f32): it stands
                 for the collective in the asked dtype, half its bytes

`stands_for(module, found)` returns, per collective, the parts it stands for (one per operand
that a mechanism explains, its index in `operand`: a tuple all-reduce may gather some operands
and scatter others),
read with the walks of inspector/dataflow.py;
inspector/reconcile.py holds them against the expectation. Nothing here is assumed of a
backend: each mechanism is found in the program's text, or the op stands for itself.
"""

import re

import numpy as np

from .dataflow import (
    MOVES, callee, dtype_of, element_of, elements_of, index_of, inserted_convert, operand_of,
    producer, readers, root_of,
)  # fmt: skip
from .hlo import Found
from .hlo_module import ITEMSIZE, Instruction, Module
from .slices import kept
from .slices import shape_text as _shape
from .slices import zero as _zero

_HIGH = re.compile(r'operand_precision=\{(?!default)|precision_config=\{[^}]*(?:HIGH|high)')


def _dot_at_default(module: Module, result: Instruction) -> Instruction | None:
    """The dot or convolution that reads the collective's result without a precision of its own
    (DEFAULT: a TPU's one bf16 pass), if one does."""
    return next(
        (u for u in readers(module, result) if u.opcode in ('dot', 'convolution')
         and not _HIGH.search(u.line)),
        None,
    )  # fmt: skip


def _part(kind, compiled, stands, mechanism, reason, operand: int = 0) -> dict:
    return {'kind': kind, 'compiled_bytes': compiled, 'bytes': stands, 'mechanism': mechanism,
            'reason': reason, 'operand': operand}  # fmt: skip


def narrowed(module: Module, found: Found, op: Instruction, result: Instruction) -> list[dict]:
    """The operands converted to a narrower float for the collective, to feed a dot."""
    c = found.collective
    if op.opcode not in ('all-gather', 'all-to-all', 'collective-permute', 'all-reduce'):
        return []
    out = []
    for n, (shape, dtype) in enumerate(zip(c.shapes, c.dtypes)):
        src = operand_of(module, op, n)
        convert = inserted_convert(module, src) if src is not None else None
        dot = _dot_at_default(module, result) if convert is not None else None
        if dot is None:
            continue
        wide = dtype_of(operand_of(module, convert, 0).type)
        each = int(np.prod(shape)) * ITEMSIZE[dtype]
        out.append(_part(
            c.kind, each, each * ITEMSIZE[wide] // ITEMSIZE[dtype], 'narrowed',
            f'{wide} values moved in {dtype}: a convert the compiler inserted (%{convert.name}'
            + (', a copy that narrows' if convert.opcode == 'copy' else '') + ') '
            f'feeds the {c.kind}, for a dot at DEFAULT matmul precision (%{dot.name}; a TPU '
            f'multiplies {wide} in one {dtype} pass), so it moves half the {wide} bytes', n,
        ))  # fmt: skip
    return out


def _update_into_zeros(module: Module, i: Instruction | None):
    """The dynamic-update-slice writing a shard into zeros that `i` is (through copies and a
    fusion's root), or None."""
    for _ in range(8):
        if i is None:
            return None
        if i.opcode == 'dynamic-update-slice':
            return i if _zero(module, operand_of(module, i, 0)) else None
        if i.opcode not in MOVES and i.opcode != 'fusion':
            return None
        i = root_of(module, callee(i)) if i.opcode == 'fusion' else operand_of(module, i, 0)
    return None


def _is_dot(module: Module, i: Instruction | None) -> bool:
    p = producer(module, i)
    return p is not None and p.opcode in ('dot', 'convolution')


def _summed_dots(module: Module, i: Instruction | None) -> list[Instruction]:
    """The dot products an add (a tree of adds) sums, when every addend is one; else []."""
    p = producer(module, i)
    if p is None or p.opcode != 'add':
        return [p] if _is_dot(module, p) else []
    terms = [_summed_dots(module, operand_of(module, p, n)) for n in range(len(p.operands))]
    return [t for ts in terms for t in ts] if all(terms) else []


def all_reduce_parts(module: Module, found: Found, op: Instruction) -> list[dict]:
    """The operands of an all-reduce that are an all-gather (zero-padded) or a reduce-scatter
    (sliced) in disguise."""
    c, out = found.collective, []
    if op.opcode != 'all-reduce' or found.fused_as:
        return []
    n_dev = c.group_size
    for n, (shape, dtype) in enumerate(zip(c.shapes, c.dtypes)):
        whole = int(np.prod(shape))
        each = whole * ITEMSIZE[dtype]
        if not shape or n_dev < 2:
            continue
        update = _update_into_zeros(module, operand_of(module, op, n))
        if update is not None:
            shard = elements_of(operand_of(module, update, 1).type)
            if shard * n_dev == whole:
                out.append(_part(
                    'all-gather', each, each, 'zero-padded',
                    f'an all-gather done as an all-reduce: each device writes its '
                    f'{_shape(operand_of(module, update, 1).type)} shard into a zeroed '
                    f'{dtype}[{",".join(map(str, shape))}] (%{update.name}; {whole - shard} '
                    'elements of zeros) and the devices sum it', n,
                ))  # fmt: skip
            continue
        dots = _summed_dots(module, operand_of(module, op, n))
        if len(dots) > 1:
            out.append(_part(
                'all-reduce', each, each * len(dots), 'reassociated',
                f'{len(dots)} all-reduces of partial sums done as one of their sum (psum(a) + '
                f'psum(b) = psum(a + b)): its operand adds the products of '
                f'{", ".join("%" + d.name for d in dots[:3])}, as the backward sums one input\'s '
                'gradients from its uses', n,
            ))  # fmt: skip
            continue
        held = kept(module, element_of(module, op, n, len(c.shapes) > 1), whole, n_dev)
        if held is not None:
            dims, how = held
            out.append(_part(
                'reduce-scatter', each, each // n_dev, 'sliced',
                f'a reduce-scatter done as an all-reduce of the whole '
                f'{dtype}[{",".join(map(str, shape))}], each device then keeping {how}', n,
            ) | {'shape': dims})  # fmt: skip
    return out


def _pad_behind(module: Module, out: Instruction | None) -> Instruction | None:
    """The pad an all-reduce-scatter's output was sliced from: output <- dynamic-slice <- (tuple
    element of) the all-reduce <- its operand, a pad."""
    if out is None or out.opcode != 'dynamic-slice':
        return None
    reduced, k = operand_of(module, out, 0), 0
    if reduced is not None and reduced.opcode == 'get-tuple-element':
        reduced, k = operand_of(module, reduced, 0), index_of(reduced)
    if reduced is None or reduced.opcode != 'all-reduce':
        return None
    pad = operand_of(module, reduced, k)
    return pad if pad is not None and pad.opcode == 'pad' else None


def padded(module: Module, found: Found) -> list[dict]:
    """The outputs of a reduce-scatter fused from an all-reduce and a slice (a TPU's
    `all-reduce-scatter` fusion) whose operand was padded to split into the devices' tiles."""
    fusion = module.instructions.get(found.name)
    root = root_of(module, callee(fusion)) if fusion is not None else None
    if root is None:
        return []
    outs = root.operands if root.opcode == 'tuple' else [root.name]
    c, parts = found.collective, []
    for n, (name, shape, dtype) in enumerate(zip(outs, c.shapes, c.dtypes)):
        pad = _pad_behind(module, module.instructions.get(name))
        if pad is None:
            continue
        unpadded, padded_to = elements_of(operand_of(module, pad, 0).type), elements_of(pad.type)
        each = int(np.prod(shape)) * ITEMSIZE[dtype]
        amount = re.search(r'padding=([\dx_]+)', pad.line)
        parts.append(_part(
            'reduce-scatter', each, each * unpadded // padded_to, 'padded',
            f'an all-reduce and a slice fused into a reduce-scatter (%{found.name}), its '
            f'{_shape(operand_of(module, pad, 0).type)} padded to {_shape(pad.type)} (%{pad.name}, '
            f'padding={amount.group(1) if amount else "?"}) to split into {c.group_size} tiles: '
            f'each device keeps a [{",".join(map(str, shape))}] tile holding '
            f'{unpadded // c.group_size:,} elements of its own', n,
        ))  # fmt: skip
    return parts


def realigned(module: Module, found: Found, op: Instruction) -> list[dict]:
    """A collective-permute of rows of a padded reduce-scatter's result, to their owners."""
    if found.collective.kind != 'collective-permute':
        return []
    src = operand_of(module, op, 0)
    for _ in range(6):
        if src is None or src.opcode not in MOVES | {'slice', 'dynamic-slice',
                                                       'get-tuple-element'}:
            break
        src = operand_of(module, src, 0)
    fused = callee(src) if src is not None and src.opcode == 'fusion' else None
    if not fused or not fused.startswith('all-reduce-scatter'):
        return []
    pad = next((i for i in module.computations.get(fused, []) if i.opcode == 'pad'), None)
    if pad is None:  # a fused reduce-scatter without padding has nothing to shift back
        return []
    each = found.collective.bytes
    return [_part(
        'reduce-scatter', each, 0, 'padded',
        f'rows of the padded reduce-scatter %{src.name} ({_shape(pad.type)} from '
        f'{_shape(operand_of(module, pad, 0).type)}) moved to the devices that own them: the '
        "padding shifts each device's tile, and this permute shifts it back",
    )]  # fmt: skip


def stands_for(module: Module, found: Found) -> list[dict]:
    """The parts of one compiled collective that stand for another written one, each with the
    mechanism found for it in this program (module docstring); [] when it stands for itself."""
    op = result = module.instructions.get(found.name)
    if found.fused_as:
        return padded(module, found)
    if op is not None and op.opcode == 'fusion':  # a TPU's async chain: the op in its start
        inner = module.computations.get(callee(op), [])
        op = next((i for i in inner if re.sub(r'-start$', '', i.opcode) == found.collective.kind),
                  None)  # fmt: skip
        result = module.async_done(result, op) if op is not None else None
    elif op is not None and op.opcode.endswith('-start'):
        result = next((u for u in module.users.get(op.name, []) if u.opcode.endswith('-done')), op)
    if op is None or result is None:
        return []
    return (
        narrowed(module, found, op, result) or all_reduce_parts(module, found, op)
        or realigned(module, found, op)
    )  # fmt: skip
