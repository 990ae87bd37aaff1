"""Reads a compiled XLA program's optimized HLO text (`Compiled.as_text()`): its collectives, the
source frames XLA kept for each op, which computation runs inside which loop and how often.

Plain text parsing, so that one parser serves every JAX version this project runs on: the
metadata comes in two spellings, the older inline `source_file="..." source_line=N` and the newer
module-level stack-frame table (`FileNames`, `FunctionNames`, `FileLocations`, `StackFrames`,
each op naming its innermost frame with `stack_frame_id=N`). `jax.experimental.source_mapper`
parses both too, but keeps only the innermost frame; attribution needs the whole chain, to walk
out of jax, flax and optax to the first line of the user's own code.
"""

import dataclasses
import re

import numpy as np

KINDS = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all', 'collective-permute')
_OP = re.compile(
    r'^\s*(?:ROOT\s+)?%\S+ = (?P<type>.+?) (?P<kind>' + '|'.join(KINDS) + r')(?:-start)?\(',
    re.MULTILINE,
)
_ARRAY = re.compile(r'(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]')
_BYTES = {'f32': 4, 's32': 4, 'u32': 4, 'bf16': 2, 'f16': 2, 'f64': 8, 's8': 1, 'u8': 1, 'pred': 1}
_INSTR = re.compile(r'^\s*(?:ROOT\s+)?%(?P<name>\S+) = (?P<type>.+?) (?P<opcode>[a-z][\w\-]*)\(')
_COMP = re.compile(r'^(?:ENTRY\s+)?%(?P<name>\S+) \(.*\{\s*$')
_CALLS = re.compile(
    r'\b(?P<key>condition|body|to_apply|calls|true_computation|false_computation)=%(?P<c>[\w.\-]+)'
)
_BRANCHES = re.compile(r'\b(?:branch_computations|called_computations)=\{(?P<cs>[^}]*)\}')


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
        return sum(int(np.prod(s)) * _BYTES[d] for s, d in zip(self.shapes, self.dtypes))


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
    """Every collective op in the program, in order of appearance."""
    return [c for c, _ in _collective_lines(hlo_text)]


def _collective_lines(hlo_text: str):
    for m in _OP.finditer(hlo_text):
        arrays = _ARRAY.findall(m.group('type'))
        line = hlo_text[m.start() : hlo_text.find('\n', m.start())]
        # mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_1'}: up to the axes
        groups = re.search(r"replica_groups=(mesh\[.*?\{[^}]*\}|.+?)(?:, [a-z_]+=|$)", line)
        pairs = re.search(r'source_target_pairs=(\{.*?\}\})', line)
        c = Collective(
            kind=m.group('kind'),
            shapes=tuple(tuple(int(d) for d in dims.split(',') if d) for _, dims in arrays),
            dtypes=tuple(dtype for dtype, _ in arrays),
            replica_groups=groups.group(1) if groups else f'pairs={pairs.group(1)}',
        )
        yield c, line


def compiled_text(jitted, *args) -> str:
    return jitted.lower(*args).compile().as_text()


@dataclasses.dataclass
class Instruction:
    name: str
    opcode: str
    type: str
    computation: str
    line: str

    @property
    def operands(self) -> list[str]:
        args = self.line[self.line.index(self.opcode + '(') + len(self.opcode) + 1 :]
        return re.findall(r'%([\w.\-]+)', args.split('), ')[0])


@dataclasses.dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str


class Module:
    """One optimized HLO module: instructions by computation, loop multipliers, source frames."""

    def __init__(self, text: str):
        self.text = text
        self.instructions: dict[str, Instruction] = {}
        self.computations: dict[str, list[Instruction]] = {}
        self.entry = None
        comp = None
        for line in text.splitlines():
            if m := _COMP.match(line):
                comp = m.group('name')
                self.computations[comp] = []
                self.entry = comp if line.startswith('ENTRY') else self.entry
            elif comp and (m := _INSTR.match(line)):
                i = Instruction(m.group('name'), m.group('opcode'), m.group('type'), comp, line)
                self.instructions[i.name] = i
                self.computations[comp].append(i)
        self.users: dict[str, list[Instruction]] = {}
        for i in self.instructions.values():
            for o in i.operands:
                self.users.setdefault(o, []).append(i)
        self.frames = _frame_table(text)
        self.multiplier, self.unknown_trip = self._multipliers()

    def _multipliers(self):
        """How many times each computation runs per call of the program: the product of the
        `known_trip_count` of every while loop around it (nested loops multiply). A loop whose
        count XLA could not prove counts once and is listed in `unknown_trip`."""
        callers: dict[str, list[tuple[str, int]]] = {}
        unknown = set()
        for i in self.instructions.values():
            trip = 1
            if i.opcode == 'while':
                t = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', i.line)
                trip = int(t.group(1)) if t else 1
                unknown |= set() if t else {i.name}
            called = [(m.group('c'), m.group('key')) for m in _CALLS.finditer(i.line)]
            for m in _BRANCHES.finditer(i.line):
                called += [(c, 'branch') for c in re.findall(r'%([\w.\-]+)', m.group('cs'))]
            for c, key in called:
                factor = trip if key in ('body', 'condition') else 1
                callers.setdefault(c, []).append((i.computation, factor))
        memo = {self.entry: 1}

        def mult(c, seen=()):
            if c not in memo:
                memo[c] = (
                    sum(mult(p, seen + (c,)) * f for p, f in callers.get(c, []) if p not in seen)
                    or 1
                )
            return memo[c]

        return {c: mult(c) for c in self.computations}, unknown

    def stack(self, line: str) -> list[Frame]:
        """The source frames of one instruction line, innermost first."""
        if m := re.search(r'stack_frame_id=(\d+)', line):
            return self.frames(int(m.group(1)))
        if m := re.search(r'source_file="([^"]*)" source_line=(\d+)', line):
            return [Frame(m.group(1), int(m.group(2)), '')]
        return []

    def dot_flops(self, computation: str) -> float:
        """2 x result elements x contracted elements, for every dot in one computation."""
        total = 0.0
        for i in self.computations[computation]:
            if i.opcode != 'dot':
                continue
            lhs = self.instructions.get(i.operands[0])
            contract = re.search(r'lhs_contracting_dims=\{([\d,]*)\}', i.line)
            if lhs is None or contract is None:
                continue
            dims = [int(d) for d in _ARRAY.search(lhs.type).group('dims').split(',') if d]
            k = int(np.prod([dims[int(c)] for c in contract.group(1).split(',') if c]))
            out = [int(d) for d in _ARRAY.search(i.type).group('dims').split(',') if d]
            total += 2.0 * int(np.prod(out)) * k
        return total


def _frame_table(text: str):
    """id -> innermost-first frames, from the module's stack-frame table. XLA prints each
    frame's parent as its 1-based id + 1 (so 1 means none): `2 {... parent_frame_id=2}` is
    called from frame 1. jax 0.10.2 and 0.12 both print it so."""
    sections: dict[str, dict[int, str]] = {}
    current = None
    for line in text.splitlines():
        s = line.strip()
        if s in ('FileNames', 'FunctionNames', 'FileLocations', 'StackFrames'):
            current = sections.setdefault(s, {})
        elif current is not None and (m := re.match(r'(\d+)\s+(.*)', s)):
            current[int(m.group(1))] = m.group(2)
        elif s and current is not None:
            current = None
    names = {k: v.strip('"') for k, v in sections.get('FileNames', {}).items()}
    funcs = {k: v.strip('"') for k, v in sections.get('FunctionNames', {}).items()}
    attrs = lambda v: {a: int(b) for a, b in re.findall(r'(\w+)=(\d+)', v)}
    locs = {k: attrs(v) for k, v in sections.get('FileLocations', {}).items()}
    frames = {k: attrs(v) for k, v in sections.get('StackFrames', {}).items()}

    def chain(frame_id: int) -> list[Frame]:
        out, seen = [], set()
        while frame_id in frames and frame_id not in seen:
            seen.add(frame_id)
            loc = locs.get(frames[frame_id]['file_location_id'], {})
            out.append(
                Frame(
                    names.get(loc.get('file_name_id'), '?'),
                    loc.get('line', 0),
                    funcs.get(loc.get('function_name_id'), ''),
                )
            )
            frame_id = frames[frame_id].get('parent_frame_id', 1) - 1
        return out

    return chain
