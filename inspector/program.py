"""One compiled program, read: its collectives with their attribution and predicted cost, its
compute, its step band, the partitioner's warnings; and `inspect()`, the same for any jitted
function a user hands in."""

import collections
import concurrent.futures
import contextlib
import dataclasses
import os
import sys
import tempfile
import time

import jax
import numpy as np

from . import asked, cost, surprises
from . import target as targets
from .attribute import attribute
from .hlo import logical
from .hlo_module import Module
from .mechanisms import stands_for
from .target import TargetError
from .target_figures import DoesNotFit, does_not_fit, memory, not_fitting, own_cost

VERSION = 3  # of the JSON: 1 had kind, shapes, dtypes, replica_groups, bytes, group_size; 2
# named memory's compiler_peak `peak`


@contextlib.contextmanager
def captured_stderr(into: list):
    """Everything written to file descriptor 2 meanwhile (XLA logs from C++, below Python's
    sys.stderr), appended to `into` as one string and written back to stderr afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors='replace')
            into.append(text)
            sys.stderr.write(text)


def compile_with_warnings(lowered):
    """(compiled, the partitioner's warnings printed while compiling, the partitioned program's
    text: inspector/asked.py)."""
    return compile_all([('program', lowered)])['program']


def compile_all(named_lowered) -> dict:
    """{name: (compiled, its partitioner warnings, its partitioned program's text)} for an
    iterable of (name, lowered program); compiled is a target.DoesNotFit where the target's
    compiler found its HBM too small. Compiles on two threads (XLA releases the GIL), so that
    the next program is traced and lowered (Python) while the previous one compiles. A warning
    goes to the program whose HLO carries its op_name, or to every program when none does.
    Nothing is written to JAX's persistent cache (target.uncached): what each compile dumps is
    read (inspector/asked.py), and an executable read back from a cache dumps nothing."""
    logs, futures = [], {}
    with contextlib.ExitStack() as stack, targets.uncached():
        stack.enter_context(captured_stderr(logs))
        pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(2))
        for name, lowered in named_lowered:
            options, read = stack.enter_context(asked.dumping())
            futures[name] = (pool.submit(lowered.compile, options), read)
        compiled, partitioned = {}, {}
        for name, (f, read) in futures.items():
            try:
                compiled[name] = f.result()
            except Exception as e:  # a target's compiler refuses what its HBM cannot hold
                if (why := does_not_fit(e)) is None:
                    raise
                compiled[name] = DoesNotFit(why)  # reported as such; the others still are
            partitioned[name] = read()
    texts = {n: c.as_text() for n, c in compiled.items() if not isinstance(c, DoesNotFit)}
    out = {name: (c, [], partitioned[name]) for name, c in compiled.items()}
    for w in surprises.remat_warnings(logs[0]):
        owners = [n for n, t in texts.items() if w['op_name'] and f'"{w["op_name"]}"' in t]
        for name in owners or list(out):
            out[name][1].append(w)
    return out


def dot_dtype(module: Module) -> str:
    """The dtype most of the program's dots (a TPU's convolutions) produce: what the chip's
    peak is looked up by."""
    dots = [i.type for i in module.instructions.values() if i.opcode in ('dot', 'convolution')]
    kinds = [t.split('[')[0] for t in dots]
    return max(set(kinds), key=kinds.count) if kinds else 'f32'


def flops(compiled, module: Module) -> float:
    """cost_analysis() FLOPs (per device), with every loop body counted trip-count times: XLA's
    cost analysis counts a while body once, so the body's dot FLOPs x (trips - 1) are added."""
    ca = compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    total = float((ca or {}).get('flops', 0.0))
    for comp, mult in module.multiplier.items():
        if mult > 1:
            total += (mult - 1) * module.dot_flops(comp)
    return total


def analyse(compiled, mesh, hardware: str, warnings=(), target=None, partitioned='') -> dict:
    """{'ops': one record per collective, 'predicted': the step on `hardware`, 'warnings',
    'asked': the collectives of the `partitioned` program (its text, compile_all's third)};
    for a `target` (inspector/target.py) also 'memory' per device against its HBM, and the
    target compiler's own cost figures under predicted['target_cost']."""
    if isinstance(compiled, DoesNotFit):
        return not_fitting(compiled, target, hardware)
    hw = cost.HARDWARE[hardware]
    text = compiled.as_text()
    module = Module(text)
    ops = []
    for found, where in zip(logical(module), attribute(text, mesh, module)):
        c = found.collective
        each = cost.collective_us(c.kind, c.bytes, c.group_size, hw)
        ops.append(
            dataclasses.asdict(c)
            | {'bytes': c.bytes, 'group_size': c.group_size}
            | where
            | {'predicted_us': round(each * where['trip_count'], 3)}
            | {'stands_for': stands_for(module, found)}
        )
    total_flops = flops(compiled, module)
    compute = cost.compute_us(total_flops, dot_dtype(module), hw)
    comms = sum(op['predicted_us'] for op in ops)
    lo, hi = cost.step_band(compute, comms)
    predicted = {
        'hardware': hardware,
        'flops': total_flops,
        'compute_us': round(compute, 3),
        'comms_us': round(comms, 3),
        'step_us': [round(lo, 3), round(hi, 3)],
        'loops_without_trip_count': sorted(module.unknown_trip),
    }
    asked_ops = asked.collectives(partitioned, mesh)
    asked.compare(ops, asked_ops, target.platform if target is not None else backend_of(mesh))
    result = {'ops': ops, 'predicted': predicted, 'warnings': list(warnings), 'asked': asked_ops}
    if target is not None:
        result['memory'] = memory(compiled, target)
        predicted['target_cost'] = own_cost(compiled)
    return result


def bytes_by_line(ops, source) -> dict:
    """{line: bytes moved per step} for the lines of `source` on each collective's stack."""
    out = collections.Counter()
    for op in ops:
        for frame in op['stack']:
            file, _, line = frame.partition(' ')[0].rpartition(':')
            if file == source:
                out[line] += op['bytes'] * op['trip_count']
                break
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def measure_us(compiled, args) -> float:
    """The median wall time of 3 runs of `compiled` on zeros (after one warm-up run)."""

    def zeros():
        return jax.tree.map(
            lambda s: jax.device_put(np.zeros(s.shape, s.dtype), getattr(s, 'sharding', None)),
            args,
        )

    times = []
    for i in range(4):
        fresh = zeros()  # a train step donates its state
        t = time.perf_counter()
        jax.block_until_ready(compiled(*fresh))
        times.append(time.perf_counter() - t)
    return round(float(np.median(times[1:])) * 1e6, 1)


def backend_of(mesh) -> str:
    """The platform a program for `mesh` is compiled for here ('cpu', 'gpu', 'tpu')."""
    devices = getattr(mesh, 'devices', None)
    return devices.flat[0].platform if devices is not None else jax.default_backend()


def _mesh_of(args):
    for leaf in jax.tree.leaves(args):
        mesh = getattr(getattr(leaf, 'sharding', None), 'mesh', None)
        if mesh is not None and getattr(mesh, 'devices', None) is not None:
            return mesh
    return None


def _whole_arrays(args) -> list[tuple[str, int]]:
    """(path, elements) of every sharded argument: an all-gather of that many elements brings a
    whole one back."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        spec = getattr(getattr(leaf, 'sharding', None), 'spec', None)
        if spec is not None and any(s is not None for s in spec):
            out.append((jax.tree_util.keystr(path), int(np.prod(leaf.shape))))
    return out


@dataclasses.dataclass
class Report:
    """The inspector's answer for one program: `.text()`, `.json()`, `.html(path)`,
    `.trace(path)`."""

    data: dict

    def text(self) -> str:
        from .render import program_text

        return program_text(self.data)

    def json(self) -> dict:
        return self.data

    def html(self, path: str) -> str:
        from .html import write_html

        return write_html(self.data, path)

    def trace(self, path: str) -> str:
        from .trace import write_trace

        return write_trace(self.data, path)


def inspect(jitted, *args, hardware: str | None = None, mesh=None, name: str = 'program',
            expect_gathers=(), measure: bool = False, target: str | None = None) -> Report:  # fmt: skip
    """Compiles `jitted` for `args` (arrays or jax.ShapeDtypeStructs with shardings) and reads
    its collectives. `mesh`: whose axis names to report (default: the first argument's).
    `expect_gathers`: mesh axes over which whole arguments may be all-gathered (FSDP's 'fsdp').
    `measure`: also time the program here, on zeros (beside the prediction for --hardware=cpu).
    `hardware`: what to price it on (default h100x8). `target`: compile it for that hardware
    instead (inspector/target.py: 'tpu-v5e-8' ...), priced on it: the arguments move to the
    target's devices, their shardings' specs kept on the same mesh shapes. A function that
    names a mesh of its own must build it from `inspector.target.devices(target)`."""
    chosen = targets.get(target) if target else None
    if chosen and hardware is not None and hardware != chosen.hardware:
        raise ValueError(
            f'hardware={hardware} with target={target}: a target is priced on its own hardware'
        )
    hardware = chosen.hardware if chosen else (hardware or 'h100x8')
    if hardware not in cost.HARDWARE:
        raise ValueError(f'--hardware={hardware}: expected one of {", ".join(cost.HARDWARE)}')
    if chosen:
        devices = targets.devices(target)
        args = targets.onto(args, devices)
        mesh = targets.mesh_on(mesh, devices) if mesh is not None else None
        measure = False  # nothing of the target's runs here
    try:
        lowered = jitted.lower(*args)
    except ValueError as e:
        if chosen and 'device' in str(e).lower():
            raise TargetError(
                f'--target={target}: the program names devices of this machine ({str(e)[:120]}'
                '...): build its mesh from inspector.target.devices(target), or take a '
                'devices= argument (--program)'
            ) from e
        raise
    compiled, warnings, partitioned = compile_with_warnings(lowered)
    if isinstance(compiled, DoesNotFit):  # one program: nothing else to report
        raise TargetError(f'the program does not fit {target}: {compiled.reason}')
    mesh = mesh or _mesh_of(args)
    result = analyse(compiled, mesh, hardware, warnings, chosen, partitioned)
    if measure:
        result['predicted']['measured_us'] = measure_us(compiled, args)
    found = surprises.program_surprises(result, _whole_arrays(args), expect_gathers)
    files = collections.Counter(op['file'] for op in result['ops'] if op['file'])
    source = files.most_common(1)[0][0] if files else ''
    data = {
        'version': VERSION,
        'hardware': hardware,
        'hardware_note': cost.HARDWARE[hardware].sources,
        'devices': mesh.size if mesh is not None else (1 if chosen else jax.device_count()),
        'axes': list(mesh.axis_names) if mesh is not None else [],
        'programs': {name: result['ops']},
        'predicted': {name: result['predicted']},
        'warnings': {name: result['warnings']},
        'surprises': {name: found},
        'sources': {
            name: {'file': source, 'bytes_by_line': bytes_by_line(result['ops'], source)}
        },
    }
    if chosen:
        data |= {'target': chosen.name, 'device_kind': chosen.device_kind,
                 'target_here': chosen.here, 'memory': {name: result['memory']}}  # fmt: skip
    return Report(data)
