"""Reads a compiled XLA program's optimized HLO text (`Compiled.as_text()`): its collectives, the
source frames XLA kept for each op, which computation runs inside which loop and how often.

Plain text parsing, so that one parser serves every JAX version this project runs on: the
metadata comes in two spellings, the older inline `source_file="..." source_line=N` and the newer
module-level stack-frame table (`FileNames`, `FunctionNames`, `FileLocations`, `StackFrames`,
each op naming its innermost frame with `stack_frame_id=N`). `jax.experimental.source_mapper`
parses both too, but keeps only the innermost frame; attribution needs the whole chain, to walk
out of jax, flax and optax to the first line of the user's own code.

What a collective is, read from any backend's text (`logical`): XLA:CPU prints each as one op.
A TPU prints some as several: an async all-gather is a fusion whose computation holds the
all-gather and ends in the custom call `AsyncCollectiveStart`, followed by continuation fusions
(the matmul that consumes it, holding the same all-gather again) and a done fusion (the same
all-gather, `AsyncCollectiveDone`); those copies are one collective, counted at its start. A
reduce-scatter can be an `all-reduce-scatter` fusion (an all-reduce of the whole padded
gradients, then a slice per device): one reduce-scatter, with the fusion's results and source
line. `-start`/`-done` pairs (a TPU's collective-permute, a GPU's all-gather) carry the operand
and the result in the start's type: the result is the done's. Loops: XLA:CPU and GPU print a
`known_trip_count`; a TPU does not, and the count is read from the loop's condition,
`counter < constant(N)`.
"""

import dataclasses
import re

import numpy as np

KINDS = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all', 'collective-permute')
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
    """Every collective of the program, once each (module docstring), in order of appearance."""
    return [f.collective for f in logical(Module(hlo_text))]


def _collective_lines(hlo_text: str, module=None):
    """(collective, the line its source metadata is read from), once each."""
    for f in logical(module or Module(hlo_text)):
        yield f.collective, f.line


def _groups(line: str) -> str:
    # mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_1'}: up to the axes
    groups = re.search(r"replica_groups=(mesh\[.*?\{[^}]*\}|.+?)(?:, [a-z_]+=|$)", line)
    pairs = re.search(r'source_target_pairs=(\{.*?\}\})', line)
    return groups.group(1) if groups else f'pairs={pairs.group(1) if pairs else "{}"}'


def _arrays(type_text: str):
    found = _ARRAY.findall(type_text)
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


_SKIP_BETWEEN = {'get-tuple-element', 'bitcast', 'constant', 'parameter', 'tuple'}


def logical(module: 'Module') -> list[Found]:
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
        self.callers: dict[str, list[Instruction]] = {}
        for i in self.instructions.values():
            for m in _CALLS.finditer(i.line):
                self.callers.setdefault(m.group('c'), []).append(i)
        self.trips = {}  # while instruction -> (trip count or None, where it was read)
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
                n, how = self.trip_count(i)
                self.trips[i.name] = (n, how)
                trip = n or 1
                unknown |= set() if n else {i.name}
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

    def trip_count(self, loop: Instruction) -> tuple[int | None, str]:
        """(trips, where read) of a while loop: XLA's `known_trip_count` (CPU, GPU), else its
        condition `counter < constant(N)` (a TPU prints no known_trip_count); the counter
        starts at 0, as JAX's scan and fori_loop counters do. (None, '') when neither says."""
        if t := re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.line):
            return int(t.group(1)), 'known_trip_count'
        cond = re.search(r'condition=%([\w.\-]+)', loop.line)
        body = self.computations.get(cond.group(1), []) if cond else []
        root = next((j for j in body if j.line.lstrip().startswith('ROOT')), None)
        if root is None or root.opcode != 'compare' or 'direction=LT' not in root.line:
            return None, ''
        for o in root.operands[1:]:
            c = self.instructions.get(o)
            if c is not None and c.opcode == 'constant':
                if m := re.search(r'constant\((\d+)\)', c.line):
                    return int(m.group(1)), 'condition'
        return None, ''

    def caller(self, computation: str) -> Instruction | None:
        """The fusion that calls `computation`, if a fusion does."""
        return next((i for i in self.callers.get(computation, []) if i.opcode == 'fusion'), None)

    def async_role(self, computation: str) -> str:
        """'start', 'done' or 'continuation' for a fusion computation of a TPU async collective
        chain (module docstring); '' for any other."""
        body = self.computations.get(computation, [])
        root = next((j for j in body if j.line.lstrip().startswith('ROOT')), None)
        if root is not None and 'custom_call_target="AsyncCollectiveStart"' in root.line:
            return 'start'
        if root is not None and 'custom_call_target="AsyncCollectiveDone"' in root.line:
            return 'done'
        return 'continuation' if computation.startswith('async_collective_fusion') else ''

    def async_done(self, start: Instruction, collective: Instruction) -> Instruction | None:
        """The done fusion of the async chain `start` begins: the first fusion after it, in
        its computation's schedule, whose done computation holds the same collective."""
        key = [re.search(p, collective.line) for p in (r'channel_id=\d+', r'chain_id="\d+"')]
        key = [k.group(0) for k in key if k]
        seq = self.computations[start.computation]
        for j in seq[seq.index(start) + 1 :]:
            called = re.search(r'calls=%([\w.\-]+)', j.line) if j.opcode == 'fusion' else None
            if called and self.async_role(called.group(1)) == 'done':
                inner = self.computations[called.group(1)]
                if any(all(k in x.line for k in key) for x in inner if x.opcode in KINDS):
                    return j
        return None

    def between(self, start: Instruction, done: Instruction | None) -> tuple:
        """(name, what) of each op the schedule runs between an async collective's start and
        its done: what it overlaps (a matmul, another collective, a copy, other fusions)."""
        if done is None or done.computation != start.computation:
            return ()
        seq = self.computations[start.computation]
        out = []
        for j in seq[seq.index(start) + 1 : seq.index(done)]:
            if j.opcode in _SKIP_BETWEEN:
                continue
            out.append((j.name, self.what(j)))
        return tuple(out)

    def what(self, i: Instruction) -> str:
        """An op in a word: matmul (a dot or convolution, or a fusion holding one; on a TPU,
        one continuing an async collective), the collective kind, copy, or its opcode."""
        called = re.search(r'calls=%([\w.\-]+)', i.line) if i.opcode == 'fusion' else None
        inner = self.computations.get(called.group(1), []) if called else [i]
        if any(j.opcode in ('dot', 'convolution') for j in inner):
            return 'matmul'
        kinds = [re.sub(r'-start$', '', j.opcode) for j in inner]
        if kind := next((k for k in kinds if k in KINDS), None):
            return kind
        return 'copy' if i.opcode.startswith('copy') else i.opcode

    def stack(self, line: str) -> list[Frame]:
        """The source frames of one instruction line, innermost first."""
        if m := re.search(r'stack_frame_id=(\d+)', line):
            return self.frames(int(m.group(1)))
        if m := re.search(r'source_file="([^"]*)" source_line=(\d+)', line):
            return [Frame(m.group(1), int(m.group(2)), '')]
        return []

    def dot_flops(self, computation: str) -> float:
        """2 x result elements x contracted elements, for every dot in one computation (and
        every convolution: a TPU prints its matmuls as convolutions)."""
        total = 0.0
        for i in self.computations[computation]:
            if i.opcode == 'convolution':
                total += self._convolution_flops(i)
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

    def _convolution_flops(self, i: Instruction) -> float:
        """2 x result elements x (kernel elements / output features): each output element is a
        dot over one window of the input's features (dim_labels names the kernel's `o`)."""
        labels = re.search(r'dim_labels=\w+_(\w+)->\w+', i.line)
        kernel = self.instructions.get(i.operands[1]) if len(i.operands) > 1 else None
        if labels is None or kernel is None or 'o' not in labels.group(1):
            return 0.0
        dims = [int(d) for d in _ARRAY.search(kernel.type).group('dims').split(',') if d]
        out = [int(d) for d in _ARRAY.search(i.type).group('dims').split(',') if d]
        per_output = int(np.prod(dims)) / dims[labels.group(1).index('o')]
        return 2.0 * int(np.prod(out)) * per_output


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
