"""Sections run in fresh processes of this benchmark: section 1 (the twins) in several, to take
each ratio's median over them, and section 5 (nanoGPT's configuration) in one of 2 emulated
devices. Each child runs in a session of its own: Ctrl-C reaches the benchmark alone, which
stops it (subprocess kills the child), and nothing but one line is printed."""

import json
import pathlib
import subprocess
import sys

from benchmarks import SectionFailed
from benchmarks.options import NANOGPT_DEVICES


def child(section: str, devices: int, rounds: int, cpu_fma: bool) -> dict:
    """The results of `section`, run by a fresh process of this benchmark that emulates
    `devices` CPU devices (and runs every section in-process: --processes=1). The child runs
    in a session of its own: Ctrl-C reaches this process alone, which stops it."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            '-m',
            'benchmarks.run',
            f'--sections={section}',
            f'--rounds={rounds}',
            f'--cpu_devices={devices}',
            f'--cpu_fma={cpu_fma}',
            '--processes=1',
            f'--out={tmp}',
        ]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, start_new_session=True)
        if done.returncode:
            raise SectionFailed(
                f'section {section}: its child process failed (exit {done.returncode}); what '
                'it printed is above', 1
            )  # fmt: skip
        return json.loads((pathlib.Path(tmp) / 'results.json').read_text())


def nanogpt_process(rounds: int, cpu_fma: bool) -> dict:
    """Section nanogpt, run by a child process that emulates NANOGPT_DEVICES CPU devices.

    XLA:CPU sizes its thread pool to the larger of the core count and the device count. With 8
    emulated devices on 2 cores, 8 threads share 2 cores, and one device's step on its own
    (nothing else running) took 62 ms against 50 ms in a process of 1 or 2 devices: the
    oversubscription, not the model. So the one-device and two-device figures come from a
    process with 2 devices, one per core, as PyTorch ran nanoGPT with one thread per core.
    """
    result = child('nanogpt', NANOGPT_DEVICES, rounds, cpu_fma)
    return {**result['nanogpt'], 'process_devices': result['machine']['devices']}


def twins_processes(rounds: int, processes: int, devices: int, cpu_fma: bool) -> list[dict]:
    """Section twins, run `processes` times, each in a fresh process. Per model, the row of the
    process whose explicit/auto ratio is the median (so that every figure in it comes from one
    process), with every process's ratios and step times beside it.

    Within one process the rounds agree with each other, but the ratio moves between processes:
    8 emulated devices run 8 threads on 2 cores, and what a process draws holds for its life.
    On the 2-core VM, ten probe processes (benchmarks/results/NOTES.md) gave the transformer's
    explicit/auto 0.90 to 1.03: explicit held at 63-68 ms while auto took 64-68 ms in some and
    71-72 in others. More rounds cannot average that away; more processes can (pyperf runs each
    benchmark in 20 for the same reason). The auto_copy column of each process shows how far
    the same program strays from itself there. With --platform=gpu, section twins runs once,
    in the benchmark's own process."""
    runs = [child('twins', devices, rounds, cpu_fma)['twins'] for _ in range(processes)]
    rows = []
    for per_process in zip(*runs):
        ranked = sorted(per_process, key=lambda r: r['explicit_over_auto'])
        row = dict(ranked[(len(ranked) - 1) // 2])  # the median; the lower one of an even count
        for ratio in ('explicit_over_auto', 'typed_over_auto', 'auto_copy_over_auto'):
            row[f'{ratio}_runs'] = [r[ratio] for r in per_process]
        row['processes_ms'] = [{k: r[k] for k in r if k.endswith('_ms')} for r in per_process]
        rows.append(row)
    return rows
