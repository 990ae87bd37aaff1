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
from .hlo_module import ARRAY, ITEMSIZE, Instruction, Module

_HIGH = re.compile(r'operand_precision=\{(?!default)|precision_config=\{[^}]*(?:HIGH|high)')


def _dot_at_default(module: Module, result: Instruction) -> Instruction | None:
    """The dot or convolution that reads the collective's result without a precision of its own
    (DEFAULT: a TPU's one bf16 pass), if one does."""
    return next(
        (u for u in readers(module, result) if u.opcode in ('dot', 'convolution')
         and not _HIGH.search(u.line)),
        None,
    )  # fmt: skip


def _shape(type_text: str) -> str:
    m = ARRAY.search(type_text)
    return f"{m.group('dtype')}[{m.group('dims')}]" if m else type_text


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


def _zero(module: Module, i: Instruction | None) -> bool:
    """Whether `i` is a broadcast of a zero constant (through fusions, their parameters and
    moves: XLA:CPU wraps a lone broadcast in a fusion of its own)."""
    i = producer(module, i)
    if i is None or i.opcode != 'broadcast':
        return False
    c = producer(module, operand_of(module, i, 0))
    zero = c is not None and c.opcode == 'constant' and re.search(r'constant\(-?0(\.0*)?\)', c.line)
    return bool(zero)


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


def _dims(type_text: str) -> list[int]:
    m = ARRAY.search(type_text)
    return [int(d) for d in m.group('dims').split(',') if d] if m else []


def _one_slice(module: Module, u: Instruction, whole: int, n_dev: int):
    """(the shape kept, how) when `u`, a use of a value of `whole` elements, keeps 1/n_dev of it:
    a dynamic-slice of that size; or a scatter of it (its updates: the buffer is zeros, the
    indices integers) into zeros of that size, as an embedding's gradient is written into each
    device's rows; else None."""
    if elements_of(u.type) * n_dev != whole:
        return None
    if u.opcode == 'dynamic-slice':
        return _dims(u.type), f'its {_shape(u.type)} (%{u.name})'
    indices = operand_of(module, u, 1) if u.opcode == 'scatter' else None
    zeros = indices is not None and _zero(module, operand_of(module, u, 0))
    if zeros and dtype_of(indices.type)[:1] in 'su':
        return _dims(u.type), (
            f'its {_shape(u.type)}: the whole scattered into zeros of that size (%{u.name}), '
            "its indices offset to the device's rows"
        )
    return None


def _scatter_loop(module: Module, u: Instruction, whole: int, n_dev: int):
    """The scatter of `_one_slice` as XLA expands it where it does not keep the op (XLA:CPU at
    --xla_backend_optimization_level=0): the value handed in a tuple, with integer indices and
    zeros of 1/n_dev its size, to a call or loop that writes rows into the zeros
    (dynamic-update-slice), the value itself not read from its result. (kept shape, how)."""
    users = module.users.get(u.name, [])
    if u.opcode != 'tuple' or len(users) != 1 or users[0].opcode not in ('call', 'while'):
        return None
    ops = [operand_of(module, u, n) for n in range(len(u.operands))]
    buffer = next((o for o in ops if o is not None and elements_of(o.type) * n_dev == whole
                   and _zero(module, o)), None)  # fmt: skip
    mine = [n for n, o in enumerate(ops) if o is not None and elements_of(o.type) == whole]
    if buffer is None or not any(dtype_of(o.type)[:1] in 'su' for o in ops if o is not None):
        return None
    loop, todo, seen = users[0], [callee(users[0], 'to_apply') or callee(users[0], 'body')], set()
    while todo and len(seen) < 20:  # the loop's computations: one writes rows into the zeros
        comp = todo.pop()
        seen.add(comp)
        body = module.computations.get(comp, [])
        todo += [c for i in body for c in (callee(i), callee(i, 'body')) if c and c not in seen]
    writes = any(i.opcode == 'dynamic-update-slice'
                 for c in seen for i in module.computations.get(c, []))  # fmt: skip
    read = any(g.opcode == 'get-tuple-element' and index_of(g) in mine and module.users.get(g.name)
               for g in module.users.get(loop.name, []))  # fmt: skip
    if not writes or read:
        return None
    return _dims(buffer.type), (
        f'its {_shape(buffer.type)}: the whole written row by row into zeros of that size by '
        f'%{loop.name} (a scatter expanded into a loop), its indices offset to the device\'s rows'
    )


def _summed_over_loop(module: Module, u: Instruction) -> Instruction | None:
    """The loop's result `u` accumulates into, when `u` is an add of a loop's carried value k
    (its body's parameter's element k) that the body hands on as carry k (a gradient summed
    over a pipeline's ticks): the get-tuple-element k of that loop; else None."""
    if u.opcode != 'add':
        return None
    prev, i = None, u
    for _ in range(8):  # through moves and a fusion's root to the body's root tuple
        prev, users = i, module.users.get(i.name, [])
        if i.line.lstrip().startswith('ROOT'):
            i = next((c for c in module.callers.get(i.computation, []) if c.opcode == 'fusion'),
                     None)  # fmt: skip
        else:
            i = users[0] if len(users) == 1 and users[0].opcode in MOVES | {'tuple'} else None
        if i is None or i.opcode == 'tuple':
            break
    if i is None or i.opcode != 'tuple' or not i.line.lstrip().startswith('ROOT'):
        return None
    k = i.operands.index(prev.name)
    loop = next((c for c in module.callers.get(i.computation, [])
                 if c.opcode == 'while' and callee(c, 'body') == i.computation), None)  # fmt: skip
    carried = [producer(module, operand_of(module, u, n)) for n in range(len(u.operands))]
    if loop is None or not any(
        c is not None and c.opcode == 'get-tuple-element' and index_of(c) == k
        and c.computation == i.computation for c in carried
    ):  # fmt: skip
        return None
    return next((g for g in module.users.get(loop.name, [])
                 if g.opcode == 'get-tuple-element' and index_of(g) == k), None)  # fmt: skip


def _kept(module: Module, result: Instruction | None, whole: int, n_dev: int, depth: int = 0):
    """(the shape each device keeps of an all-reduce's operand, how) when every use of its
    result keeps 1/n_dev (`_one_slice`), or stacks it with others (a concatenate: one layer's
    piece of a stacked gradient) into an array every use of which keeps 1/n_dev of the stack,
    or adds it to a loop's carry whose sum the loop hands out is so kept (`_summed_over_loop`);
    else None. A piece's kept shape is its share of the stack's slice (None where the pieces
    differ in shape)."""
    uses = readers(module, result) if result is not None else []
    kept = []
    for u in uses:
        total = _summed_over_loop(module, u) if depth < 2 else None
        if total is not None:  # added to a loop's carry: what the loop's sum is kept as
            got = _kept(module, total, whole, n_dev, depth + 1)
            loop = operand_of(module, total, 0).name
            kept.append(got and (got[0], f'{got[1]} of the sum it adds up over the loop %{loop}'))
            continue
        if u.opcode != 'concatenate':
            kept.append(_one_slice(module, u, whole, n_dev) or _scatter_loop(module, u, whole,
                                                                            n_dev))  # fmt: skip
            continue
        stack = _dims(u.type)
        pieces = {_shape(operand_of(module, u, k).type) for k in range(len(u.operands))}
        slices = [_one_slice(module, s, elements_of(u.type), n_dev) for s in readers(module, u)]
        if not slices or None in slices or len(pieces) != 1:
            return None
        cut, how = slices[0]
        dims = [p * c // s for p, c, s in zip(_dims(pieces.pop()), cut, stack)]
        dims = dims if int(np.prod(dims)) * n_dev == whole else None
        how = (f'its share of {how[4:]}, cut from the stack %{u.name} ({_shape(u.type)}) of '
               f'{len(u.operands)} such pieces')  # fmt: skip
        kept.append((dims, how))
    if not kept or None in kept:
        return None
    return kept[0]


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
        kept = _kept(module, element_of(module, op, n, len(c.shapes) > 1), whole, n_dev)
        if kept is not None:
            dims, how = kept
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
