"""Where each collective came from: the user's line and function, forward or backward, which mesh
axes it runs over, whether the partitioner or the user's code put it there, which line consumes
it, and how many times a step runs it.

Origin: where the XLA marks the op `is_spmd_generated` (jax 0.12 does, as a frontend attribute;
0.10.2 does not), the mark says whether the partitioner made it. Otherwise a stated heuristic:
the last primitive of the op's `op_name` path says who asked for the collective.
  - `written`: a collective primitive (psum, all_gather, ppermute, psum_scatter, all_to_all, ...):
    someone wrote it, in a shard_map;
  - `requested`: a sharding annotation (with_sharding_constraint, reshard, device_put): an
    annotation asked for a layout, and the partitioner moved the data to make it so;
  - `partitioner`: anything else (a dot_general, reduce_sum, add_any ...): the SPMD partitioner
    inserted it to make the shardings of a computation agree.
"""

import itertools
import os
import re

import numpy as np

from .hlo import device_groups, logical
from .hlo_module import Frame, Module

WRITTEN = {
    'psum', 'pmean', 'pmax', 'pmin', 'all_gather', 'ppermute', 'psum_scatter', 'reduce_scatter',
    'all_to_all', 'psum_invariant', 'pbroadcast', 'all_gather_invariant', 'pshuffle',
}  # fmt: skip
REQUESTED = {'sharding_constraint', 'reshard', 'device_put', 'mesh_cast', 'shard_alike'}
_LIBRARY = ('/site-packages/', '/dist-packages/', '/lib/python3', '<frozen', '/jax/_src/')
_PASS_THROUGH = {'get-tuple-element', 'bitcast', 'copy', 'tuple', 'copy-start', 'copy-done'}
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep  # the inspector package
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shorten(path: str) -> str:
    """A path relative to the repository (or the working directory) when under it."""
    for root in (REPO, os.getcwd()):
        if path.startswith(root + os.sep):
            return os.path.relpath(path, root)
    return path


def ours(path: str) -> bool:
    """Under this project (a checkout, or shard_parity installed in site-packages: the twins'
    files), not in a library installed beside it (a checkout's .venv)."""
    return path.startswith(REPO + os.sep) and '-packages' + os.sep not in path[len(REPO) :]


def user_frames(stack: list[Frame]) -> list[Frame]:
    """The frames in the user's own code (no jax, flax, optax or standard library), innermost
    first, with paths shortened; up to the inspector's own frame that lowered the program (what
    called the inspector is no part of the program)."""
    out = []
    for f in stack:
        if f.file.startswith(_HERE):
            break
        if ours(f.file) or not any(part in f.file for part in _LIBRARY):
            out.append(Frame(shorten(f.file), f.line, f.function))
    return out


def phase(op_name: str, differentiates: bool = True) -> str:
    """backward when any part of the op runs in a transpose (jax's name for the backward pass of
    grad: `transpose(jvp(...))`), forward in a jvp; in a program that differentiates, an op in
    neither ran outside the differentiated function (a gradient sync written after grad, the
    optimizer): `outside-grad`. A program with no grad is all forward."""
    if 'transpose(' in op_name:
        return 'backward'
    return 'forward' if 'jvp(' in op_name or not differentiates else 'outside-grad'


def loop_phases(module: Module, differentiates: bool) -> dict[str, str]:
    """{computation: phase} for each loop body or fused computation (not the entry) whose ops'
    op_names agree on one phase: the body of the forward's scan over the layers is `forward`,
    the backward's `backward` (besides ops named after the shard_map alone, which say neither);
    one that holds both (a pipeline's ticks) has none. A collective the compiler made there with
    no op_name of its own (a TPU's all-gather done as an all-reduce) runs in that phase."""
    out = {}
    for comp, body in module.computations.items():
        if comp == module.entry:
            continue
        names = (re.search(r'op_name="([^"]*)"', i.line) for i in body)
        found = {phase(m.group(1), differentiates) for m in names if m}
        found = found - {'outside-grad'} or found
        if len(found) == 1:
            out[comp] = found.pop()
    return out


def origin(op_name: str, line: str) -> tuple[str, str]:
    """(origin, what it was read from): the XLA's own `is_spmd_generated` mark where it prints
    one (jax 0.12 does; 0.10.2 does not), else the op_name heuristic of the module docstring."""
    prims = {p.split('[')[0] for p in re.findall(r'([\w\-]+)(?=[:)]|$)', op_name)}
    if re.search(r'is_spmd_generated="?true', line):
        return ('requested' if prims & REQUESTED else 'partitioner'), 'is_spmd_generated'
    if prims & WRITTEN:
        return 'written', 'heuristic'
    return ('requested' if prims & REQUESTED else 'partitioner'), 'heuristic'


def mesh_axes(groups_text: str, line: str, mesh) -> list[str] | None:
    """The mesh axes a collective runs over, by name: the set of axes whose groups of devices
    are exactly the collective's replica groups (device ids are positions in the mesh's device
    list, as SPMD numbers them). Groups that are only part of an axis's groups (2 of the 8
    devices of 'data') read `data~2`. None when no set of axes matches."""
    if mesh is None:
        return None
    shape = tuple(mesh.devices.shape)
    names = list(mesh.axis_names)
    grid = np.arange(int(np.prod(shape))).reshape(shape)
    if groups_text.startswith('pairs='):  # collective-permute: the axes its pairs step along
        pairs = [tuple(map(int, p)) for p in re.findall(r'\{(\d+),(\d+)\}', groups_text)]
        coords = [np.unravel_index(a, shape) for p in pairs for a in p]
        moved = {
            names[k]
            for s, t in pairs
            for k, (a, b) in enumerate(zip(np.unravel_index(s, shape), np.unravel_index(t, shape)))
            if a != b
        }
        return [n for n in names if n in moved] if coords else []
    want = {frozenset(g) for g in device_groups(groups_text)}
    useful = [k for k, s in enumerate(shape) if s > 1]
    for r in range(len(useful) + 1):
        for subset in itertools.combinations(useful, r):
            moved = np.moveaxis(grid, subset, range(-len(subset), 0)) if subset else grid
            size = int(np.prod([shape[k] for k in subset])) if subset else 1
            groups = {frozenset(g) for g in moved.reshape(-1, size).tolist()}
            if groups == want:
                return [names[k] for k in subset]
            if all(any(g <= h for h in groups) for g in want):  # part of these axes' groups
                return [f"{'/'.join(names[k] for k in subset)}~{len(next(iter(want)))}"]
    return None


def consumer(module: Module, name: str) -> list[Frame]:
    """The user frames of the first op that reads the collective's result (through tuple
    elements, bitcasts, copies and the -done of an async pair): the partitioner may label a
    collective with its producer's line, and the consumer's line is then the telling one."""
    todo, seen = [name], set()
    while todo:
        n = todo.pop(0)
        for u in module.users.get(n, []):
            if u.name in seen:
                continue
            seen.add(u.name)
            if u.opcode in _PASS_THROUGH or u.opcode.endswith('-done'):
                todo.append(u.name)
            elif frames := user_frames(module.stack(u.line)):
                return frames
    return []


def consumer_op_name(module: Module, name: str, depth: int = 6) -> str:
    """The op_name of the nearest op that reads the collective's result, through ops that carry
    none (slices, concatenations, copies, the -done of an async pair): what the result is for."""
    todo, seen = [(name, 0)], {name}
    while todo:
        n, d = todo.pop(0)
        for u in module.users.get(n, []):
            if u.name in seen:
                continue
            seen.add(u.name)
            if m := re.search(r'op_name="([^"]*)"', u.line):
                return m.group(1)
            if d < depth:
                todo.append((u.name, d + 1))
    return ''


def producer(module: Module, name: str, depth: int = 6) -> tuple[list[Frame], str]:
    """(user frames, op_name) of the nearest op whose result the collective reads, through ops
    that carry no source line: for a collective neither it nor its consumer labels (a TPU's
    all-reduce-scatter fusion, a collective-permute-start), the line that made its operand."""
    todo, seen = [(name, 0)], {name}
    while todo:
        n, d = todo.pop(0)
        i = module.instructions.get(n)
        for o in i.operands if i is not None and d < depth else []:
            if o in seen or o not in module.instructions:
                continue
            seen.add(o)
            line = module.instructions[o].line
            if frames := user_frames(module.stack(line)):
                return frames, (re.search(r'op_name="([^"]*)"', line) or [None, ''])[1]
            todo.append((o, d + 1))
    return [], ''


def _adds(module: Module, i) -> bool:
    if i.opcode == 'add':
        return True
    called = re.search(r'calls=%([\w.\-]+)', i.line) if i.opcode == 'fusion' else None
    return bool(called) and any(
        j.opcode == 'add' for j in module.computations.get(called.group(1), [])
    )


def accumulates_in_loop(module: Module, name: str) -> bool:
    """Whether a collective inside a loop body has its result added to a value the loop carries
    (an operand read from the body's parameter, which the collective itself does not read) and
    handed on to the next iteration: the sum over iterations could be taken locally and reduced
    once, after the loop."""
    i = module.instructions.get(name)
    if i is None or module.multiplier.get(i.computation, 1) <= 1:
        return False
    body = module.computations[i.computation]
    params = {j.name for j in body if j.opcode == 'parameter'}
    carried = {j.name for j in body if j.opcode == 'get-tuple-element' and set(j.operands) & params}
    root = next((j for j in body if j.line.lstrip().startswith('ROOT')), None)
    feeds, todo = set(), [name]  # what the collective itself reads: that carry is no sum
    while todo:
        j = module.instructions.get(todo.pop())
        for o in j.operands if j else []:
            if o not in feeds:
                feeds.add(o)
                todo.append(o)
    carried -= feeds
    todo, seen = [name], set()
    while todo:
        for u in module.users.get(todo.pop(), []):
            if u.name in seen or u.computation != i.computation:
                continue
            seen.add(u.name)
            if u.opcode in _PASS_THROUGH:
                todo.append(u.name)
            elif _adds(module, u) and set(u.operands) & carried and root is not None:
                return u.name in root.operands
    return False


def attribute(hlo_text: str, mesh=None, module: Module | None = None) -> list[dict]:
    """One record per collective of the program, in order of appearance."""
    module = module or Module(hlo_text)
    differentiates = 'jvp(' in hlo_text
    in_loop = loop_phases(module, differentiates)
    out = []
    for found in logical(module):
        c, line, name = found.collective, found.line, found.name
        op_name = (re.search(r'op_name="([^"]*)"', line) or [None, ''])[1]
        frames = user_frames(module.stack(line))
        comp = module.instructions[name].computation if name in module.instructions else None
        used = consumer(module, name)
        made, made_by = producer(module, name) if not (frames or used) else ([], '')
        # with no name of its own: the phase of the loop it runs in; else, where neither it nor
        # its consumer has a line (a TPU's fused reduce-scatter of the gradients, feeding the
        # optimizer), of the op it feeds; else of the op that made its operand
        fed = consumer_op_name(module, name) if made and not op_name else ''
        when = phase(op_name or fed or made_by, differentiates)
        when = when if op_name else in_loop.get(comp, when)
        # newer XLA may label a partitioner's collective with its operand's name only (no
        # frame): the line of the op that reads it is then the line that asked for it; failing
        # that (a TPU's fused reduce-scatter), the line that made what it reads
        where = (frames or used or made or [Frame('', 0, '')])[0]
        how, told = origin(op_name, line)
        out.append(
            {
                'name': name,
                'file': where.file,
                'line': where.line,
                'function': where.function,
                'stack': [f'{f.file}:{f.line} {f.function}' for f in frames],
                'op_name': op_name,
                'phase': when,
                'origin': how,
                'origin_from': told,
                'located_by': (
                    'own' if frames else 'consumer' if used else 'producer' if made else 'none'
                ),
                'axes': mesh_axes(c.replica_groups, line, mesh),
                'trip_count': module.multiplier.get(comp, 1),
                'accumulates_in_loop': accumulates_in_loop(module, name),
                'consumer': f'{used[0].file}:{used[0].line} {used[0].function}' if used else '',
                # a TPU's or GPU's program: started, then awaited after `overlaps` ran
                'async': found.asynchronous,
                'overlaps': [f'{n} ({what})' for n, what in found.between],
                'fused_as': found.fused_as,
            }
        )
    return out
