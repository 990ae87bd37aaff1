"""Where a value of an optimized HLO program comes from and where it goes, through the ops that
only move it: copies, bitcasts, slices, tuple elements, a fusion's root and parameters, a loop's
carried state. inspector/mechanisms.py reads a collective's operand back to a convert or a pad,
and its result on to a dot or a slice, with these walks.
"""

import re

import numpy as np

from .hlo_module import ARRAY, ITEMSIZE, Instruction, Module

MOVES = {'bitcast', 'copy', 'copy-start', 'copy-done', 'reshape', 'transpose'}  # the value, moved


def index_of(i: Instruction) -> int | None:
    """A get-tuple-element's index."""
    m = re.search(r'\bindex=(\d+)', i.line)
    return int(m.group(1)) if m else None


def root_of(module: Module, computation: str) -> Instruction | None:
    """The ROOT instruction of a computation: its result."""
    body = module.computations.get(computation, [])
    return next((j for j in body if j.line.lstrip().startswith('ROOT')), None)


def callee(i: Instruction, key: str = 'calls') -> str | None:
    """The computation `i` calls (a fusion's `calls`, a loop's `body`)."""
    m = re.search(rf'\b{key}=%([\w.\-]+)', i.line)
    return m.group(1) if m else None


def elements_of(type_text: str) -> int:
    """Elements of the first array in an HLO type: f32[4,64] -> 256."""
    m = ARRAY.search(type_text)
    return int(np.prod([int(d) for d in m.group('dims').split(',') if d])) if m else 0


def dtype_of(type_text: str) -> str:
    """The element type of the first array in an HLO type: f32[4,64] -> f32."""
    m = ARRAY.search(type_text)
    return m.group('dtype') if m else ''


def parameters(module: Module, computation: str | None, n: int | None = None) -> list:
    """The parameter instructions of `computation` (the n-th alone, if given): what a fusion's
    n-th operand, or a loop's carried state, is called inside it."""
    return [p for p in module.computations.get(computation or '', []) if p.opcode == 'parameter'
            and (n is None or f'parameter({n})' in p.line)]  # fmt: skip


def operand_of(module: Module, i: Instruction, n: int) -> Instruction | None:
    """`i`'s n-th operand, if the module defines it."""
    ops = i.operands
    return module.instructions.get(ops[n]) if n < len(ops) else None


def sources(module: Module, i: Instruction, k: int | None = None) -> list:
    """(instruction, tuple index) pairs whose value `i` (its element `k`) is, through ops that
    only move or select it: copies, bitcasts, slices, tuples, fusions (their root), a fusion's
    or a loop's parameters (what the caller passes in, and a loop body's own result)."""
    op = i.opcode
    if op == 'get-tuple-element':
        return [(operand_of(module, i, 0), index_of(i))]
    if op == 'tuple':
        picked = i.operands if k is None else i.operands[k : k + 1]
        return [(module.instructions.get(o), None) for o in picked]
    if op == 'fusion':
        return [(root_of(module, callee(i)), k)]
    if op == 'while':
        return [(root_of(module, callee(i, 'body')), k)]
    if op == 'parameter':
        n = int(re.search(r'parameter\((\d+)\)', i.line).group(1))
        out = []
        for c in module.callers.get(i.computation, []):
            if c.opcode == 'fusion':
                out.append((operand_of(module, c, n), k))
            elif c.opcode == 'while':  # the loop's initial value, and what each iteration hands on
                out += [(operand_of(module, c, 0), k), (root_of(module, callee(c, 'body')), k)]
        return out
    if op in MOVES or op in ('dynamic-slice', 'slice'):
        return [(operand_of(module, i, 0), None)]
    return []


def inserted_convert(module: Module, start: Instruction, limit: int = 400):
    """The convert, f32 (or wider) to a narrower float, that `start`'s value comes from through
    ops that only move it, when the compiler inserted it (the program's own casts carry a
    `convert_element_type` op_name); else None. A TPU may convert in a `copy` (its layout
    change and the narrowing in one op): that counts as the convert."""
    todo, seen = [(start, None)], set()
    while todo and len(seen) < limit:
        i, k = todo.pop(0)
        if i is None or (i.computation, i.name, k) in seen:
            continue
        seen.add((i.computation, i.name, k))
        src = operand_of(module, i, 0)
        narrows = src is not None and ITEMSIZE.get(dtype_of(src.type), 0) > ITEMSIZE.get(
            dtype_of(i.type), 0
        )
        if i.opcode == 'convert' or (i.opcode == 'copy' and narrows):
            return i if narrows and 'convert_element_type' not in i.line else None
        todo += sources(module, i, k)
    return None


def readers(module: Module, i: Instruction, limit: int = 60):
    """The ops that read `i`'s value, through copies, bitcasts and tuple elements; a fusion is
    represented by the ops inside it that read the parameter `i` is passed as (a fusion nested in
    it likewise), and, where the value leaves it unchanged as its result, by what reads that."""
    todo, seen, out = [i], set(), []
    while todo and len(seen) < limit:
        j = todo.pop(0)
        if j.line.lstrip().startswith('ROOT') and j.computation != module.entry:
            todo += [c for c in module.callers.get(j.computation, []) if c.opcode == 'fusion']
        for u in module.users.get(j.name, []):
            if u.name in seen:
                continue
            seen.add(u.name)
            if u.opcode in MOVES or u.opcode == 'get-tuple-element' or u.opcode.endswith('-done'):
                todo.append(u)
            elif u.opcode == 'fusion':  # the ops inside that read it
                todo += parameters(module, callee(u), u.operands.index(j.name))
            elif u.opcode == 'tuple' and u.line.lstrip().startswith('ROOT'):
                todo.append(u)  # a fusion's results: on to what reads them
            else:
                out.append(u)
    return out


def producer(module: Module, i: Instruction | None) -> Instruction | None:
    """The op that computes `i`'s value, through copies, bitcasts and a fusion's root, and from a
    fusion's parameter to what its caller passes in."""
    for _ in range(12):
        if i is None:
            return None
        if i.opcode == 'fusion':
            i = root_of(module, callee(i))
        elif i.opcode == 'parameter' and i.computation != module.entry:
            (i, _), *_ = sources(module, i) or [(None, None)]
        elif i.opcode in MOVES:
            i = operand_of(module, i, 0)
        else:
            return i
    return None


def element_of(module: Module, op: Instruction, n: int, tuple_valued: bool) -> Instruction:
    """What stands for operand `n`'s result: the get-tuple-element of it, for a tuple op."""
    if not tuple_valued:
        return op
    return next((u for u in module.users.get(op.name, [])
                 if u.opcode == 'get-tuple-element' and index_of(u) == n), None)  # fmt: skip


# Ops through which a value reaches an output unchanged in kind: arithmetic element by element,
# moves, selections. A contraction, a reduction, a gather or a scatter makes something else of
# it (a weight's gradient from an activation's, a statistic from a tensor), and so does any
# operand that only indexes or selects (a select's predicate, a slice's offsets).
ENDS = {'dot', 'convolution', 'reduce', 'reduce-window', 'scatter', 'gather', 'sort',
        'compare', 'is-finite', 'rng', 'rng-bit-generator', 'iota', 'fft', 'conditional', 'map',
        'select-and-scatter', 'triangular-solve', 'cholesky', 'batch-norm-grad'}  # fmt: skip
ASYNC = ('AsyncCollectiveStart', 'AsyncCollectiveDone')  # a TPU's chain: the value, carried


def _async(i: Instruction) -> bool:
    """Whether `i` is a TPU's async chain's start or done custom call (it carries its value)."""
    return i.opcode == 'custom-call' and any(f'custom_call_target="{a}"' in i.line for a in ASYNC)


def _carries(module: Module, user: Instruction, position: int) -> bool:
    """Whether `user` carries operand `position`'s value on, element by element."""
    op = user.opcode
    if op == 'custom-call':
        return _async(user)
    if op in ENDS:
        return False
    if op == 'select' or op == 'clamp':
        return position > 0 if op == 'select' else position == 1
    if op == 'broadcast':  # a scale spread over a tensor (a norm's clip) is not that tensor
        return elements_of(user.type) == elements_of(operand_of(module, user, position).type)
    if op in ('dynamic-slice', 'slice', 'pad', 'reverse'):
        return position == 0
    if op == 'dynamic-update-slice':
        return position in (0, 1)
    return True


def outputs_reached(module: Module, start: Instruction, k: int | None = None,
                    limit: int = 4000) -> set[int]:  # fmt: skip
    """The entry's result elements (indices into its ROOT tuple) that `start`'s value (its
    element `k`) reaches through ops that carry it element by element (`_carries`): the
    arithmetic of an optimizer's update, moves, slices, a fusion (in at its parameter, out at its
    root), a loop (in through its carried tuple, out where its body's root hands it on), a TPU's
    async chain. None through a dot, a reduction, a gather or a scatter: a gradient's collective
    reaches its parameter's update; an activation's reaches it only through the dot or the
    reduction that forms the gradient from it."""
    out, todo, seen = set(), [(start, k)], set()
    while todo and len(seen) < limit:
        i, k = todo.pop()
        if (i.name, k) in seen:
            continue
        seen.add((i.name, k))
        root = i.line.lstrip().startswith('ROOT')
        if root and i.opcode != 'tuple':  # a computation's result: on to its caller's users
            todo += _handed_on(module, i.computation, None)
        for u in module.users.get(i.name, []):
            positions = [n for n, o in enumerate(u.operands) if o == i.name]
            if u.opcode == 'get-tuple-element':
                if k is None or index_of(u) == k:
                    todo.append((u, None))
            elif u.opcode == 'tuple':
                for n in positions:
                    if u.line.lstrip().startswith('ROOT'):
                        if u.computation == module.entry:
                            out.add(n)
                        else:
                            todo += _handed_on(module, u.computation, n)
                    else:
                        todo.append((u, n))
            elif u.opcode in ('fusion', 'call') or u.opcode.startswith('async-start'):
                inner = callee(u) or callee(u, 'to_apply')
                todo += [(p, k) for n in positions for p in parameters(module, inner, n)]
            elif u.opcode == 'while':
                todo += [(p, k) for p in parameters(module, callee(u, 'body'))]
            elif u.opcode.endswith('-done'):
                todo.append((u, k))
            elif u.type.startswith('('):  # a variadic op (XLA's combined all-reduce): its n-th
                # result is its n-th operand's; a tuple passed whole (an opt-barrier) keeps k
                whole = k is not None and i.type.startswith('(')
                todo += [(u, k if whole else n) for n in positions if _carries(module, u, n)]
            elif any(_carries(module, u, n) for n in positions):
                todo.append((u, None))
    return out


def _handed_on(module: Module, computation: str, n: int | None) -> list:
    """What a computation's result (its element `n`) becomes in each caller: a fusion's or a
    call's result, a loop's (its body's root is the next iteration's state and, at the end, the
    loop's result)."""
    out = []
    for c in module.callers.get(computation, []):
        if c.opcode == 'while' and callee(c, 'body') != computation:
            continue  # a loop's condition hands nothing on
        if c.opcode == 'while':  # the next iteration
            out += [(p, n) for p in parameters(module, computation)]
        out.append((c, n))
    return out


def origin(module: Module, start: Instruction, limit: int = 400) -> Instruction | None:
    """The entry parameter `start`'s value comes from through ops that only move, select or
    convert it (a cast to the compute dtype before a gather, one layer's slice of a stack), or
    None when it is computed."""
    todo, seen = [(start, None)], set()
    while todo and len(seen) < limit:
        i, k = todo.pop(0)
        if i is None or (i.name, k) in seen:
            continue
        seen.add((i.name, k))
        if i.opcode == 'parameter' and i.computation == module.entry:
            return i
        if i.opcode == 'convert' or _async(i):
            todo.append((operand_of(module, i, 0), k))
        else:
            todo += sources(module, i, k)
    return None
