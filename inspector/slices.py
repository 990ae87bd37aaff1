"""What each device keeps of an all-reduce's result, read in the optimized HLO with the walks of
inspector/dataflow.py: inspector/mechanisms.py's `sliced` (a reduce-scatter done as an
all-reduce of the whole, each device then keeping its 1/n) holds where every use of the result
keeps 1/n of it. A use keeps 1/n where it is

    a dynamic-slice of that size;
    a scatter of it into zeros of that size (an embedding's gradient written into each device's
        rows), or the loop XLA expands such a scatter into (XLA:CPU at optimization level 0);
    one piece of a stack (a layer's gradient beside the others'), every use of which keeps 1/n
        of the stack: a concatenate, or a TPU's form of one, each piece padded with -inf to the
        stack's shape and the pads joined by maximum;
    an add into a loop's carry (a pipeline's ticks summing a gradient) whose sum, handed out
        of the loop, is so kept.

`kept` returns the shape kept and how, or None.
"""

import re

import numpy as np

from .dataflow import (
    MOVES, callee, dtype_of, elements_of, index_of, operand_of, producer, readers,
)  # fmt: skip
from .hlo_module import ARRAY, Instruction, Module


def shape_text(type_text: str) -> str:
    m = ARRAY.search(type_text)
    return f"{m.group('dtype')}[{m.group('dims')}]" if m else type_text


def zero(module: Module, i: Instruction | None) -> bool:
    """Whether `i` is a broadcast of a zero constant (through fusions, their parameters and
    moves: XLA:CPU wraps a lone broadcast in a fusion of its own)."""
    i = producer(module, i)
    if i is None or i.opcode != 'broadcast':
        return False
    c = producer(module, operand_of(module, i, 0))
    zero = c is not None and c.opcode == 'constant' and re.search(r'constant\(-?0(\.0*)?\)', c.line)
    return bool(zero)


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
        return _dims(u.type), f'its {shape_text(u.type)} (%{u.name})'
    indices = operand_of(module, u, 1) if u.opcode == 'scatter' else None
    zeros = indices is not None and zero(module, operand_of(module, u, 0))
    if zeros and dtype_of(indices.type)[:1] in 'su':
        return _dims(u.type), (
            f'its {shape_text(u.type)}: the whole scattered into zeros of that size (%{u.name}), '
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
                   and zero(module, o)), None)  # fmt: skip
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
        f'its {shape_text(buffer.type)}: the whole written row by row into zeros of that size by '
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


def _pieces(module: Module, u: Instruction):
    """(the stack, its pieces) when `u` joins the value with others into a stack: a concatenate
    (its operands), or a TPU's form of one, each piece padded with -inf to the stack's shape
    and the pads joined by maximum (the pads' operands); else None."""
    if u.opcode == 'concatenate':
        return u, [operand_of(module, u, k) for k in range(len(u.operands))]
    fill = producer(module, operand_of(module, u, 1)) if u.opcode == 'pad' else None
    if fill is None or 'constant(-inf)' not in fill.line:
        return None
    top, users = u, module.users.get(u.name, [])
    while len(users) == 1 and users[0].opcode == 'maximum':
        top, users = users[0], module.users.get(users[0].name, [])
    todo, pads = [top], []
    while todo:  # the maximum's leaves: each a pad of -inf
        i = todo.pop()
        if i is not None and i.opcode == 'maximum':
            todo += [operand_of(module, i, k) for k in range(len(i.operands))]
        elif i is not None and i.opcode == 'pad' and 'constant(-inf)' in (
            producer(module, operand_of(module, i, 1)) or i
        ).line:
            pads.append(i)
        else:
            return None
    return (top, [operand_of(module, p, 0) for p in pads]) if top is not u else None


def kept(module: Module, result: Instruction | None, whole: int, n_dev: int, depth: int = 0):
    """(the shape each device keeps of an all-reduce's operand, how) when every use of its
    result keeps 1/n_dev (`_one_slice`, `_scatter_loop`), or stacks it with others (one layer's
    piece of a stacked gradient, `_pieces`) into an array every use of which keeps 1/n_dev of
    the stack, or adds it to a loop's carry whose sum the loop hands out is so kept
    (`_summed_over_loop`); else None. A piece's kept shape is its share of the stack's slice
    (None where the pieces differ in shape)."""
    uses = readers(module, result) if result is not None else []
    held = []
    for u in uses:
        total = _summed_over_loop(module, u) if depth < 2 else None
        if total is not None:  # added to a loop's carry: what the loop's sum is kept as
            got = kept(module, total, whole, n_dev, depth + 1)
            loop = operand_of(module, total, 0).name
            held.append(got and (got[0], f'{got[1]} of the sum it adds up over the loop %{loop}'))
            continue
        joined = _pieces(module, u)
        if joined is None:
            held.append(_one_slice(module, u, whole, n_dev) or _scatter_loop(module, u, whole,
                                                                            n_dev))  # fmt: skip
            continue
        stack, pieces = joined
        shapes = {shape_text(p.type) for p in pieces if p is not None}
        slices = [_one_slice(module, s, elements_of(stack.type), n_dev)
                  for s in readers(module, stack)]  # fmt: skip
        if not slices or None in slices or len(shapes) != 1 or None in pieces:
            return None
        cut, how = slices[0]
        dims = [p * c // s for p, c, s in zip(_dims(shapes.pop()), cut, _dims(stack.type))]
        dims = dims if int(np.prod(dims)) * n_dev == whole else None
        how = (f'its share of {how[4:]}, cut from the stack %{stack.name} '
               f'({shape_text(stack.type)}) of {len(pieces)} such pieces')  # fmt: skip
        held.append((dims, how))
    if not held or None in held:
        return None
    return held[0]
