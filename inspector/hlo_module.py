"""The optimized HLO text of one compiled XLA program (`Compiled.as_text()`), parsed:
instructions by computation, who calls whom, how many times each computation runs per step
(loop trip counts, nested loops multiplying), a TPU's async collective chains, and the source
frames XLA kept for each op.

Plain text parsing, so that one parser serves every JAX version this project runs on: the
metadata comes in two spellings, the older inline `source_file="..." source_line=N` and the newer
module-level stack-frame table (`FileNames`, `FunctionNames`, `FileLocations`, `StackFrames`,
each op naming its innermost frame with `stack_frame_id=N`). `jax.experimental.source_mapper`
parses both too, but keeps only the innermost frame; attribution needs the whole chain, to walk
out of jax, flax and optax to the first line of the user's own code. Loops: XLA:CPU and GPU print
a `known_trip_count`; a TPU does not, and the count is read from the loop's condition,
`counter < constant(N)`. What the collectives are: inspector/hlo.py.
"""

import dataclasses
import re

import numpy as np

KINDS = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all', 'collective-permute')
ARRAY = re.compile(r'(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]')
ITEMSIZE = {'f32': 4, 's32': 4, 'u32': 4, 'bf16': 2, 'f16': 2, 'f64': 8, 's8': 1, 'u8': 1,
            'pred': 1}  # fmt: skip
# what `between` skips: bookkeeping, not work an async collective overlaps
_SKIP_BETWEEN = {'get-tuple-element', 'bitcast', 'constant', 'parameter', 'tuple'}
_INSTR = re.compile(r'^\s*(?:ROOT\s+)?%(?P<name>\S+) = (?P<type>.+?) (?P<opcode>[a-z][\w\-]*)\(')
_COMP = re.compile(r'^(?:ENTRY\s+)?%(?P<name>\S+) \(.*\{\s*$')
_CALLS = re.compile(
    r'\b(?P<key>condition|body|to_apply|calls|true_computation|false_computation)=%(?P<c>[\w.\-]+)'
)
_BRANCHES = re.compile(r'\b(?:branch_computations|called_computations)=\{(?P<cs>[^}]*)\}')



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
            dims = [int(d) for d in ARRAY.search(lhs.type).group('dims').split(',') if d]
            k = int(np.prod([dims[int(c)] for c in contract.group(1).split(',') if c]))
            out = [int(d) for d in ARRAY.search(i.type).group('dims').split(',') if d]
            total += 2.0 * int(np.prod(out)) * k
        return total

    def _convolution_flops(self, i: Instruction) -> float:
        """2 x result elements x (kernel elements / output features): each output element is a
        dot over one window of the input's features (dim_labels names the kernel's `o`)."""
        labels = re.search(r'dim_labels=\w+_(\w+)->\w+', i.line)
        kernel = self.instructions.get(i.operands[1]) if len(i.operands) > 1 else None
        if labels is None or kernel is None or 'o' not in labels.group(1):
            return 0.0
        dims = [int(d) for d in ARRAY.search(kernel.type).group('dims').split(',') if d]
        out = [int(d) for d in ARRAY.search(i.type).group('dims').split(',') if d]
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
