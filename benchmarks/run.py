"""The benchmark suite: `python -m benchmarks.run` (CPU, 8 emulated devices), `--platform=gpu` or
`--platform=tpu`.

Writes <out>/results.json (every figure), <out>/results.md (the tables the README carries) and,
where matplotlib is installed, PNG plots; a run of some sections merges into the results
recorded there, and `--target` writes only to an --out it is given (benchmarks/output.py). Each
comparison is timed side by side in this one process, interleaved, as the median of --rounds
after warm-up. Targets are printed beside the figures; nothing here passes or fails. Bad input
is one line and exit 2, before any section runs; Ctrl-C is one line and exit 130.
"""

# (Ctrl-C is caught before the third-party imports below, which take seconds)
import gc
import json
import os
import platform
import signal
import sys
import threading
import time

EARLY = 'interrupted before the first section (Ctrl-C): nothing written'
if __name__ == '__main__':  # until main() starts: one line, not a traceback from an import
    signal.signal(signal.SIGINT, lambda *_: (print(EARLY, file=sys.stderr), os._exit(130)))

import jax
from absl import app, flags

from benchmarks import SECTIONS, SectionFailed, output
from benchmarks.options import (
    CLI_BATCH_SIZES,
    CLI_ROUNDS,
    CLI_STEPS,
    CONTEXT_LENGTHS,
    CONTEXT_TIMED,
    CPU_DEVICES,
    CPU_FMA,
    MESHES,
    MFU_STEPS,
    NANOGPT_DEVICES,
    OUT,
    PLATFORM,
    PROCESSES,
    ROUNDS,
    SECTION,
    TARGET,
)
from benchmarks.options import check_data, check_flags, check_meshes, sections
from benchmarks.processes import nanogpt_process, twins_processes
from shard_parity import UsageError, refuse
from shard_parity.inspector.target import TARGETS, TargetError
from shard_parity.devices import configure_jax
from shard_parity.runtime.report import atomic_write

KEY_FLAGS = [SECTION, TARGET, MESHES, CLI_BATCH_SIZES, CLI_STEPS, CLI_ROUNDS, CONTEXT_LENGTHS,
             CONTEXT_TIMED, ROUNDS, PLATFORM, OUT, PROCESSES, CPU_DEVICES, CPU_FMA,
             MFU_STEPS]  # fmt: skip


def machine() -> dict:
    d = jax.devices()
    return {
        'platform': d[0].platform,
        'device_kind': d[0].device_kind,
        'devices': len(d),
        'host': platform.processor() or platform.machine(),
        'cpu_count': _cores(),
        'jax': jax.__version__,
        'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
        'cpu_fma': CPU_FMA.value,
    } | ({'libtpu': _libtpu()} if d[0].platform == 'tpu' else {})


def _libtpu() -> str:
    from importlib import metadata

    for name in ('libtpu', 'libtpu-nightly'):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return 'unknown'


def _cores():
    import os

    return len(os.sched_getaffinity(0))


def transformer_config(platform: str):
    """nanoGPT's configuration; on a GPU in bf16, which lets cuDNN's fused attention run, and
    on a TPU in bf16 (its 'fused': Pallas' splash attention, shard_parity/model/attention.py)."""
    import dataclasses

    from benchmarks import sections as S

    if platform == 'cpu':
        return S.NANOGPT
    return dataclasses.replace(S.NANOGPT, dtype='bfloat16', attention='fused')


def run_sections(names, rounds, platform: str, model_config, results: dict, running: list) -> None:
    """Runs each section in turn into `results`; `running` names the one under way (what an
    interruption reports)."""
    from benchmarks import one_device as O
    from benchmarks import sections as S
    from benchmarks.context import context

    n = min(8, jax.device_count())
    counts = [c for c in (1, 2, 4, 8) if c <= n]
    for name in names:
        running.append(name)
        start = time.perf_counter()
        print(f'[{name}] running ...', file=sys.stderr, flush=True)
        cpu = platform == 'cpu'
        if name == 'twins' and cpu and PROCESSES.value > 1:
            results[name] = twins_processes(
                rounds, PROCESSES.value, jax.device_count(), CPU_FMA.value
            )
        elif name == 'twins':
            results[name] = S.twins(n, rounds, model_config)
        elif name == 'sweep':
            results[name] = S.sweep(counts, rounds, model_config)
        elif name == 'attention':
            results[name] = O.attention_sweep(
                [128, 256, 512, 1024, 2048, 4096], rounds, model_config.compute_dtype
            )
        elif name == 'generation':
            results[name] = O.generation([64, 256, 1024], max(3, rounds // 2), model_config)
        elif name == 'strategies':
            results[name] = S.strategies(n, rounds, model_config, MESHES.value)
        elif name == 'context':
            lengths, timed = (list(map(int, f.value)) for f in (CONTEXT_LENGTHS, CONTEXT_TIMED))
            results[name] = context(lengths, timed, rounds, TARGET.value)
        elif name == 'memory':
            from benchmarks.memory import memory_section

            results[name] = memory_section(target=TARGET.value)
        elif name == 'memory_101m':
            from benchmarks.memory import headline

            results[name] = headline(TARGET.value)
        elif name == 'remat':
            from benchmarks.remat import remat_section

            results[name] = remat_section(rounds)
        elif name == 'cli':
            from benchmarks.cli import cli

            sizes = list(map(int, CLI_BATCH_SIZES.value))
            results[name] = cli(
                n, sizes, CLI_ROUNDS.value, CLI_STEPS.value, model_config, CPU_FMA.value
            )
        elif name == 'nanogpt' and cpu and jax.device_count() != NANOGPT_DEVICES:
            results[name] = nanogpt_process(rounds, CPU_FMA.value)
        elif name == 'nanogpt':
            results[name] = O.nanogpt(rounds, model_config)
        elif name == 'mfu':
            from benchmarks.chip import mfu

            results[name] = mfu(MFU_STEPS.value)
        elif name == 'chip_memory':
            from benchmarks.chip import chip_memory

            results[name] = chip_memory()
        print(f'[{name}] {time.perf_counter() - start:.0f} s', file=sys.stderr, flush=True)


def check_platform(asked: str, found: str) -> None:
    """--platform=gpu or tpu where JAX finds none: one line naming what it found, exit 2."""
    if asked == 'gpu' and found != 'gpu':
        refuse('--platform=gpu, but JAX finds no GPU (pip install -e ".[gpu]")')
    if asked == 'tpu' and found != 'tpu':
        refuse(
            f'--platform=tpu, but JAX finds no TPU (its devices: {found}; on a TPU host: pip '
            'install -e ".[tpu]")'
        )


def start() -> tuple[output.Output, dict]:
    """Every check a run makes before its first section (bad input: one line, exit 2): the
    flags, the outputs, the meshes, the platform, section cli's data. Returns where the
    results go and the results' header."""
    check_flags()
    suffix = ('' if PLATFORM.value == 'cpu' else f'_{PLATFORM.value}') + (
        f'_{TARGET.value}' if TARGET.value else ''
    )
    try:
        out = output.check(OUT.value, flags.FLAGS[OUT.name].present, suffix, TARGET.value)
    except UsageError as e:
        refuse(str(e))
    configure_jax(CPU_DEVICES.value if PLATFORM.value == 'cpu' else None, cpu_fma=CPU_FMA.value)
    check_meshes(MESHES.value, min(8, jax.device_count()))
    check_platform(PLATFORM.value, jax.devices()[0].platform)
    if 'cli' in sections():
        check_data()
    config = transformer_config(PLATFORM.value)
    header = {
        'machine': {
            **machine(),
            'transformer_dtype': config.dtype,
            'transformer_attention': config.attention,
        },
        'command': 'python -m benchmarks.run ' + ' '.join(sys.argv[1:]),
    }
    if TARGET.value:  # what the tables were compiled for; the host only compiled them
        chip = TARGETS[TARGET.value]
        header['machine'] |= {
            'target': chip.name, 'target_device_kind': chip.device_kind,
            'target_devices': chip.devices,
        }  # fmt: skip
    return out, header


def write(out: output.Output, results: dict) -> str:
    """The results into `out` (merged into those recorded there), the Markdown returned."""
    from benchmarks import plots, report

    if out.folder is None:
        print(
            f'--target={TARGET.value}: nothing written (the tables follow); --out=DIR keeps '
            f'results{out.suffix}.json and .md there',
            file=sys.stderr,
        )
        return report.markdown(results)
    merged, kept = output.merge(out.recorded, results, SECTIONS)
    markdown = report.markdown(merged)
    out.folder.mkdir(parents=True, exist_ok=True)
    for path, text in ((out.json, json.dumps(merged, indent=1)), (out.md, markdown)):
        atomic_write(path, lambda f, text=text: f.write(text.encode()))
    plots.plots(merged, out.folder, out.suffix)
    if kept:
        print(
            f"merged section(s) {', '.join(output.sections_of(results, SECTIONS))} into "
            f"{out.json}; kept {', '.join(kept)} from `{out.recorded['command']}`",
            file=sys.stderr,
        )
    return report.markdown(results)


def on_ctrl_c(signum, frame):
    """Ctrl-C as KeyboardInterrupt, except where it lands in a garbage collector's callback
    (JAX has one), which would print and swallow it: then again a moment later, outside it."""
    inside = {getattr(c, '__code__', None) for c in gc.callbacks}
    while frame is not None:
        if frame.f_code in inside:
            again = threading.Timer(0.01, signal.raise_signal, (signum,))
            again.daemon = True  # never outlives the run
            again.start()
            return
        frame = frame.f_back
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # one interruption is reported, once
    raise KeyboardInterrupt


def main(argv):
    if len(argv) > 1:
        refuse(f'unexpected arguments {argv[1:]}')
    signal.signal(signal.SIGINT, on_ctrl_c)  # KeyboardInterrupt from here on
    running = []
    try:
        out, results = start()
        run_sections(
            sections(), ROUNDS.value, PLATFORM.value, transformer_config(PLATFORM.value), results,
            running,
        )  # fmt: skip
    except KeyboardInterrupt:
        finished(locals().get('results'))
        where = f'during section {running[-1]}' if running else 'before the first section'
        print(f'interrupted {where} (Ctrl-C): nothing written', file=sys.stderr)
        sys.exit(130)
    except TargetError as e:  # libtpu missing, a GPU config not captured: one line
        refuse(str(e))
    except SectionFailed as e:
        finished(results)
        refuse(str(e), e.status)
    print(write(out, results))


def finished(results: dict | None) -> None:
    """The tables of the sections that finished before a run stopped, on stdout: their
    figures are not written, but not lost."""
    if results and output.sections_of(results, SECTIONS):
        from benchmarks import report

        print(report.markdown(results))


if __name__ == '__main__':
    from shard_parity.runtime import declare_key_flags, parse_flags

    declare_key_flags(KEY_FLAGS)  # defined in benchmarks/options.py; --help exits 0
    app.run(main, flags_parser=parse_flags)
