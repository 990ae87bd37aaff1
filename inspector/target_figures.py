"""What a target's compiler says of a program besides its HLO: the memory each device needs,
held against the chip's HBM (and the compiler's own refusal when the HBM cannot hold it), and its
cost_analysis() figures. The report's `memory` and `predicted.target_cost` (inspector/program.py);
the benchmarks' compile-only sections read the same figures.

`compiler_peak` names memory_analysis()'s peak_memory_in_bytes, the compiler's own figure, apart
from any peak this project sums from parts (shard_parity/memory.py).
"""

import dataclasses
import re

from .target import Target

_HBM = re.compile(r'total memory required for HLO temporaries \(([\d.]+\w?)\) exceeds '
                  r'available HBM \(([\d.]+\w?)\)')  # fmt: skip


def does_not_fit(error: Exception) -> str | None:
    """The compiler's own one-line reason when `error` is the TPU's out-of-HBM compile error
    (RESOURCE_EXHAUSTED), else None."""
    text = str(error)
    if 'RESOURCE_EXHAUSTED' not in text and 'Ran out of memory' not in text:
        return None
    if m := _HBM.search(text):
        return f'needs {m.group(1)} of HLO temporaries, above the {m.group(2)} of HBM available'
    line = next((ln for ln in text.splitlines() if 'memory' in ln.lower()), text.splitlines()[0])
    return line.strip()[:300]


@dataclasses.dataclass(frozen=True)
class DoesNotFit:
    """A program the target's compiler refused because the chip's HBM cannot hold it: what the
    report shows in its place."""

    reason: str  # the compiler's figures: 'needs 36.08G of HLO temporaries, above the 15.75G ...'


def not_fitting(refused: DoesNotFit, target: Target, hardware: str) -> dict:
    """analyse()'s result for a program that does not fit: no collectives, no prediction, its
    memory verdict with the compiler's reason."""
    predicted = {
        'hardware': hardware, 'flops': 0.0, 'compute_us': 0.0, 'comms_us': 0.0,
        'step_us': [0.0, 0.0], 'loops_without_trip_count': [], 'does_not_fit': refused.reason,
        'target_cost': {'flops': 0.0, 'bytes_accessed': 0.0, 'optimal_us': None,
                        'optimal_note': 'not compiled: it does not fit'},
    }  # fmt: skip
    fields = ('arguments', 'outputs', 'aliased', 'temp', 'code', 'compiler_peak')
    memory = dict.fromkeys(fields) | {
        'peak_field': 'peak_memory_in_bytes', 'hbm': target.hbm_bytes, 'fits': False,
        'reason': refused.reason,
    }  # fmt: skip
    return {'ops': [], 'predicted': predicted, 'warnings': [], 'memory': memory}


def memory(compiled, target: Target | None) -> dict:
    """Per-device bytes of a compiled program, from memory_analysis(), and against the target's
    HBM: `compiler_peak` is the compiler's own peak_memory_in_bytes (on a TPU the arguments and
    live buffers at their largest; XLA:CPU prints the arguments there), `fits` whether it is
    within `hbm`. (Not shard_parity/memory.py's figures, which are sums of the state's parts.)"""
    m = compiled.memory_analysis()
    out = {
        'arguments': m.argument_size_in_bytes,
        'outputs': m.output_size_in_bytes,
        'aliased': m.alias_size_in_bytes,
        'temp': m.temp_size_in_bytes,
        'code': m.generated_code_size_in_bytes,
        'compiler_peak': m.peak_memory_in_bytes,
        'peak_field': 'peak_memory_in_bytes',
    }
    if target is not None and target.hbm_bytes:
        out |= {'hbm': target.hbm_bytes, 'fits': m.peak_memory_in_bytes <= target.hbm_bytes}
    return out


def own_cost(compiled) -> dict:
    """The target compiler's own cost_analysis(), where its figures are sensible: FLOPs and
    bytes accessed per device (a while body counted once, as on the CPU), and its
    `optimal_seconds` only when positive (libtpu gives large negative values for some
    programs: kept out, and said so)."""
    ca = compiled.cost_analysis()
    ca = (ca[0] if isinstance(ca, (list, tuple)) else ca) or {}
    seconds = ca.get('optimal_seconds')
    return {
        'flops': float(ca.get('flops', 0.0)),
        'bytes_accessed': float(ca.get('bytes accessed', 0.0)),
        'optimal_us': round(seconds * 1e6, 3) if seconds is not None and seconds > 0 else None,
        'optimal_note': (
            '' if seconds is None or seconds > 0
            else f'optimal_seconds {seconds:.3g} s from the compiler: not a time, left out'
        ),
    }  # fmt: skip
