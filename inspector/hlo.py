"""The collectives of a compiled XLA program, read from its optimized HLO text (parsed by
inspector/hlo_module.py): what each moves (kind, operand shapes and dtypes, replica groups), once
per collective however the backend prints it.

What a collective is, read from any backend's text (`logical`): XLA:CPU prints each as one op.
A TPU prints some as several: an async all-gather is a fusion whose computation holds the
all-gather and ends in the custom call `AsyncCollectiveStart`, followed by continuation fusions
(the matmul that consumes it, holding the same all-gather again) and a done fusion (the same
all-gather, `AsyncCollectiveDone`); those copies are one collective, counted at its start. A
reduce-scatter can be an `all-reduce-scatter` fusion (an all-reduce of the whole padded
gradients, then a slice per device): one reduce-scatter, with the fusion's results and source
line. `-start`/`-done` pairs (a TPU's collective-permute, a GPU's all-gather) carry the operand
and the result in the start's type: the result is the done's.
"""

import dataclasses
import re

import numpy as np

from .hlo_module import ARRAY, ITEMSIZE, KINDS, Module


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str
    shapes: tuple[tuple[int, ...], ...]  # one per operand (XLA combines several into a tuple)
    dtypes: tuple[str, ...]
    replica_groups: str

    @property
    def group_size(self) -> int:
        """Devices in each replica group, whichever of XLA's three spellings the HLO uses."""
        g = self.replica_groups
        if g.startswith('pairs'):  # collective-permute: pairs={{0,0},{1,2},...}, every device
            return g.count('},{') + 1
        return len(device_groups(g)[0])

    @property
    def bytes(self) -> int:
        return sum(int(np.prod(s)) * ITEMSIZE[d] for s, d in zip(self.shapes, self.dtypes))


def _iota(spec: str) -> np.ndarray:
    """`[4,2]T(1,0)` -> the device ids in that order: iota reshaped, transposed (flattened)."""
    m = re.match(r'\[([\d,]+)\](?:T\(([\d,]+)\))?', spec.strip())
    dims = [int(d) for d in m.group(1).split(',')]
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    if m.group(2):
        ids = ids.transpose([int(p) for p in m.group(2).split(',')])
    return ids.reshape(-1)


def device_groups(g: str) -> list[list[int]]:
    """The replica groups as lists of device ids, from any of XLA's three spellings:
    explicit `{{0,1,2,3},{4,5,6,7}}`, iota `[2,4]<=[8]` (or `[4,2]<=[2,4]T(1,0)`), and mesh
    `mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_1'}`."""
    if g.startswith('{{'):
        return [[int(d) for d in grp.split(',') if d] for grp in re.findall(r'\{([\d,]*)\}', g)]
    if m := re.match(r'\[(\d+),(\d+)\]<=(.*)', g):
        return _iota(m.group(3)).reshape(int(m.group(1)), int(m.group(2))).tolist()
    if g.startswith('mesh['):
        sizes = [(a, int(n)) for a, n in re.findall(r"'(\w+)'=(\d+)", g[: g.index(']')])]
        ids = re.search(r'device_ids=\((\[[\d,]+\](?:T\([\d,]+\))?)\)', g)
        n = int(np.prod([s for _, s in sizes]))
        grid = (_iota(ids.group(1)) if ids else np.arange(n)).reshape([s for _, s in sizes])
        over = re.findall(r"'(\w+)'", g[g.rindex('{') :])
        names = [a for a, _ in sizes]
        moved = np.moveaxis(grid, [names.index(a) for a in over], range(-len(over), 0))
        return moved.reshape(-1, int(np.prod([dict(sizes)[a] for a in over]))).tolist()
    if g == '{}' or not g:  # every device in one group
        return [[]]
    raise ValueError(f'unknown replica_groups format: {g}')


def collectives(hlo_text: str) -> list[Collective]:
    """Every collective of the program, once each (module docstring), in order of appearance."""
    return [f.collective for f in logical(Module(hlo_text))]


def _groups(line: str) -> str:
    # mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_1'}: up to the axes
    groups = re.search(r"replica_groups=(mesh\[.*?\{[^}]*\}|.+?)(?:, [a-z_]+=|$)", line)
    pairs = re.search(r'source_target_pairs=(\{.*?\}\})', line)
    return groups.group(1) if groups else f'pairs={pairs.group(1) if pairs else "{}"}'


def _arrays(type_text: str):
    found = ARRAY.findall(type_text)
    return (
        tuple(tuple(int(d) for d in dims.split(',') if d) for _, dims in found),
        tuple(dtype for dtype, _ in found),
    )


@dataclasses.dataclass(frozen=True)
class Found:
    """One collective of the program as it runs: what it moves, the HLO line its source
    metadata is read from, the instruction that stands for it in its computation's schedule
    (for loops and consumers), and, when asynchronous, what runs before it is awaited."""

    collective: Collective
    line: str
    name: str
    asynchronous: bool = False
    between: tuple = ()  # (instruction, what it is) scheduled between the start and the done
    fused_as: str = ''  # 'all-reduce-scatter': a reduce-scatter printed as a fusion


def logical(module: Module) -> list[Found]:
    """The program's collectives, each once (module docstring), in order of appearance."""
    out = []
    for comp, body in module.computations.items():
        role = module.async_role(comp)
        caller = module.caller(comp)
        for i in body:
            base = re.sub(r'-start$', '', i.opcode)
            if base not in KINDS or (role and role != 'start'):
                continue
            if 'chain_id=' in i.line and role != 'start' and caller is not None:
                continue  # a copy of an async chain's collective, inside a fusion
            shapes, dtypes = _arrays(i.type)
            meta = i.line if 'metadata=' in i.line or caller is None else caller.line
            kind, name, between, fused = base, i.name, (), ''
            if comp.startswith('all-reduce-scatter') and base == 'all-reduce' and caller:
                kind, name, fused = 'reduce-scatter', caller.name, 'all-reduce-scatter'
                shapes, dtypes = _arrays(caller.type)  # each device's slice of the sum
            elif role == 'start' and caller is not None:
                name = caller.name
                done = module.async_done(caller, i)
                between = module.between(caller, done)
            elif i.opcode.endswith('-start'):
                done = next(
                    (u for u in module.users.get(i.name, []) if u.opcode == base + '-done'), None
                )
                if done is not None:
                    shapes, dtypes = _arrays(done.type)
                between = module.between(i, done)
            c = Collective(kind, shapes, dtypes, _groups(i.line))
            asynchronous = role == 'start' or i.opcode.endswith('-start')
            out.append(Found(c, meta, name, asynchronous, between, fused))
    return out


def compiled_text(jitted, *args) -> str:
    return jitted.lower(*args).compile().as_text()
