"""The benchmark suite: `python -m benchmarks.run` (CPU, 8 emulated devices) or `--platform=gpu`.

Writes <out>/results.json (every figure), <out>/results.md (the tables the README carries) and,
where matplotlib is installed, PNG plots. Each comparison is timed side by side in this one
process, interleaved, as the median of --rounds after warm-up. Targets are printed beside the
figures; nothing here passes or fails.
"""

import json
import pathlib
import platform
import sys
import time

import jax
from absl import app, flags

from shard_parity import refuse
from shard_parity.inspector.target import TARGETS, TargetError
from shard_parity.mesh import configure_jax
from shard_parity.runtime.report import atomic_write

NANOGPT_DEVICES = 2  # one device per core of the 2-core machines nanoGPT's ~45 ms was timed on
SECTIONS = [
    'twins',
    'sweep',
    'attention',
    'generation',
    'nanogpt',
    'strategies',
    'context',
    'cli',
    'memory',
    'memory_101m',
]
SECTION = flags.DEFINE_list(
    'sections',
    SECTIONS[:-4],
    f'Which of {SECTIONS} to run. Default: all but context (context parallelism at T = 4,096 '
    'to 16,384: minutes of compiling; python -m benchmarks.run --sections=context), cli '
    '(whole train CLI runs: about 20 minutes at the defaults), memory (24 compiles: every '
    'twin x strategy at 2 and 4 layers, benchmarks/memory.py) and memory_101m (the README\'s '
    '101M-parameter transformer under dp, fsdp and fsdp_tp, the three twins).',
)
TARGET = flags.DEFINE_enum(
    'target',
    None,
    list(TARGETS),
    'Sections memory, memory_101m and context: compile for this hardware instead of the '
    'emulated CPU devices, which need not be here (the inspector\'s --target, '
    'inspector/target.py; tpu-*: pip install -e ".[tpu]"); nothing is timed. The other '
    'sections refuse it.',
)
MESHES = flags.DEFINE_multi_string(
    'mesh',
    [],
    'Section strategies: also time this named mesh in every twin, e.g. '
    '--mesh=data:2,fsdp:2,model:2 (the train CLIs\' --mesh; its sizes multiply to the devices, '
    'at most 8); repeat the flag for more. Each strategy\'s own mesh is always timed.',
)
CLI_BATCH_SIZES = flags.DEFINE_list(
    'cli_batch_sizes', ['16', '32'], 'Section cli: the global batch sizes.'
)
CLI_STEPS = flags.DEFINE_integer(
    'cli_steps', 300, 'Section cli: steps per train run (the first, compiling, is not timed).', 2
)
CLI_ROUNDS = flags.DEFINE_integer(
    'cli_rounds',
    4,
    'Section cli: runs of each candidate per batch size; 4 completes its cycle of orders.',
    lower_bound=1,
)
CONTEXT_LENGTHS = flags.DEFINE_list(
    'context_lengths', ['4096', '8192', '16384'], 'Section context: the sequence lengths.'
)
CONTEXT_TIMED = flags.DEFINE_list(
    'context_timed',
    ['4096'],
    'Section context: the lengths whose step is also run and timed (the others are compiled '
    "only, for their memory: dp's naive T x T scores at 16,384 need more memory than 8 "
    'emulated devices on a small machine have).',
)
ROUNDS = flags.DEFINE_integer(
    'rounds',
    12,
    'Timed rounds per comparison (after warm-up). A multiple of 12 completes the cycle of '
    'orders (benchmarks/timing.py) of the sections with an even number of candidates, so that '
    'each candidate runs right after each other one equally often; twins (5 candidates) needs '
    'a multiple of 10, strategies (15) of 30.',
    lower_bound=1,
)
PLATFORM = flags.DEFINE_enum(
    'platform',
    'cpu',
    ['cpu', 'gpu'],
    'cpu: 8 emulated CPU devices; gpu: the real GPUs, bf16, cuDNN.',
)
OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Folder for the results.')
PROCESSES = flags.DEFINE_integer(
    'processes',
    11,
    'Section twins runs in this many fresh processes, one after another, and reports each '
    "ratio's median over them, the step times of the process with the median explicit/auto, "
    "and every process's ratios (see twins_processes); 1: in this process. CPU only: with "
    '--platform=gpu, section twins runs once, in this process.',
    lower_bound=1,
)
CPU_DEVICES = flags.DEFINE_integer(
    'cpu_devices',
    8,
    'Emulated CPU devices in this process (--platform=cpu). Section nanogpt always runs in a '
    f'process of its own with {NANOGPT_DEVICES} (see nanogpt_process).',
    lower_bound=1,
)
CPU_FMA = flags.DEFINE_bool(
    'cpu_fma',
    False,
    'Let XLA:CPU use fused multiply-adds: faster, but the twins then round differently '
    '(shard_parity/mesh.py). Off by default, as in the train CLIs.',
)


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
    }


def _cores():
    import os

    return len(os.sched_getaffinity(0))


def transformer_config(gpu: bool):
    """nanoGPT's configuration; on a GPU in bf16, which lets cuDNN's fused attention run."""
    import dataclasses

    from benchmarks import sections as S

    if not gpu:
        return S.NANOGPT
    return dataclasses.replace(S.NANOGPT, dtype='bfloat16', attention='fused')


def run_sections(names, rounds, gpu: bool, model_config) -> dict:
    from benchmarks import one_device as O
    from benchmarks import sections as S
    from benchmarks.context import context

    n = min(8, jax.device_count())
    counts = [c for c in (1, 2, 4, 8) if c <= n]
    results = {}
    for name in names:
        start = time.perf_counter()
        print(f'[{name}] running ...', file=sys.stderr, flush=True)
        if name == 'twins' and not gpu and PROCESSES.value > 1:
            results[name] = twins_processes(rounds, PROCESSES.value)
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
        elif name == 'cli':
            from benchmarks.cli import cli

            sizes = list(map(int, CLI_BATCH_SIZES.value))
            results[name] = cli(
                n, sizes, CLI_ROUNDS.value, CLI_STEPS.value, model_config, CPU_FMA.value
            )
        elif name == 'nanogpt' and not gpu and jax.device_count() != NANOGPT_DEVICES:
            results[name] = nanogpt_process(rounds)
        elif name == 'nanogpt':
            results[name] = O.nanogpt(rounds, model_config)
        print(f'[{name}] {time.perf_counter() - start:.0f} s', file=sys.stderr, flush=True)
    return results


def child(section: str, devices: int, rounds: int) -> dict:
    """The results of `section`, run by a fresh process of this benchmark that emulates
    `devices` CPU devices (and runs every section in-process: --processes=1)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            '-m',
            'benchmarks.run',
            f'--sections={section}',
            f'--rounds={rounds}',
            f'--cpu_devices={devices}',
            f'--cpu_fma={CPU_FMA.value}',
            '--processes=1',
            f'--out={tmp}',
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return json.loads((pathlib.Path(tmp) / 'results.json').read_text())


def nanogpt_process(rounds: int) -> dict:
    """Section nanogpt, run by a child process that emulates NANOGPT_DEVICES CPU devices.

    XLA:CPU sizes its thread pool to the larger of the core count and the device count. With 8
    emulated devices on 2 cores, 8 threads share 2 cores, and one device's step on its own
    (nothing else running) took 62 ms against 50 ms in a process of 1 or 2 devices: the
    oversubscription, not the model. So the one-device and two-device figures come from a
    process with 2 devices, one per core, as PyTorch ran nanoGPT with one thread per core.
    """
    result = child('nanogpt', NANOGPT_DEVICES, rounds)
    return {**result['nanogpt'], 'process_devices': result['machine']['devices']}


def twins_processes(rounds: int, processes: int) -> list[dict]:
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
    runs = [child('twins', jax.device_count(), rounds)['twins'] for _ in range(processes)]
    rows = []
    for per_process in zip(*runs):
        ranked = sorted(per_process, key=lambda r: r['explicit_over_auto'])
        row = dict(ranked[(len(ranked) - 1) // 2])  # the median; the lower one of an even count
        for ratio in ('explicit_over_auto', 'typed_over_auto', 'auto_copy_over_auto'):
            row[f'{ratio}_runs'] = [r[ratio] for r in per_process]
        row['processes_ms'] = [{k: r[k] for k in r if k.endswith('_ms')} for r in per_process]
        rows.append(row)
    return rows


def check_meshes(meshes, n: int) -> None:
    """Each --mesh named and over the n devices section strategies uses, before anything runs:
    one line naming the bad one (shard_parity/plan.py's messages), as the train CLIs say it."""
    from shard_parity import UsageError
    from shard_parity import plan as plans

    for text in meshes:
        try:
            if ':' not in text:
                raise UsageError(
                    f'--mesh={text}: name the axes, e.g. data:2,fsdp:2,model:2 (section strategies '
                    'already times each strategy on its own AxB mesh)'
                )
            plans.named(text, n)
        except UsageError as e:
            refuse(str(e))


def check_data(sections) -> None:
    """Section cli trains on tiny Shakespeare (in a child process): its file is found, or
    downloaded, before the first section runs, and a missing one is the train CLI's line and
    exit status (1, docs/errors.md), not a child's traceback after the sections before it."""
    if 'cli' not in sections:
        return
    from shard_parity import exit_status
    from shard_parity.datasets import shakespeare
    from shard_parity.datasets.root import DataError, data_root

    try:
        shakespeare.load(data_root())  # where benchmarks/cli.py's runs read it
    except DataError as e:
        refuse(str(e), exit_status(e))


def main(argv):
    if len(argv) > 1:
        refuse(f'unexpected arguments {argv[1:]}')
    unknown = set(SECTION.value) - set(SECTIONS)
    if unknown:
        refuse(f'--sections has {sorted(unknown)}; choose from {SECTIONS}')
    configure_jax(CPU_DEVICES.value if PLATFORM.value == 'cpu' else None, cpu_fma=CPU_FMA.value)
    compiled_only = {'memory', 'memory_101m', 'context'}
    if TARGET.value and set(SECTION.value) - compiled_only:
        refuse(
            f'--target={TARGET.value} compiles sections {sorted(compiled_only)} only; '
            f'--sections has {sorted(set(SECTION.value) - compiled_only)}'
        )
    check_meshes(MESHES.value, min(8, jax.device_count()))
    check_data(SECTION.value)
    if PLATFORM.value == 'gpu' and jax.devices()[0].platform != 'gpu':
        refuse('--platform=gpu, but JAX finds no GPU (pip install -e ".[gpu]")')
    gpu = PLATFORM.value == 'gpu'
    config = transformer_config(gpu)
    results = {
        'machine': {
            **machine(),
            'transformer_dtype': config.dtype,
            'transformer_attention': config.attention,
        },
        'command': 'python -m benchmarks.run ' + ' '.join(sys.argv[1:]),
    }
    try:
        results |= run_sections(SECTION.value, ROUNDS.value, gpu, config)
    except TargetError as e:  # libtpu missing, a GPU config not captured: one line
        refuse(str(e))
    if TARGET.value:
        results['machine']['target'] = TARGET.value
    out = pathlib.Path(OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    suffix = ('' if PLATFORM.value == 'cpu' else '_gpu') + (f'_{TARGET.value}' if TARGET.value else '')
    from benchmarks import plots, report

    markdown = report.markdown(results)
    for name, text in (
        (f'results{suffix}.json', json.dumps(results, indent=1)),
        (f'results{suffix}.md', markdown),
    ):
        atomic_write(out / name, lambda f, text=text: f.write(text.encode()))
    plots.plots(results, out, suffix)
    print(markdown)


if __name__ == '__main__':
    from shard_parity.runtime import declare_key_flags, parse_flags

    declare_key_flags([])  # its own flags are key already; --help exits 0
    app.run(main, flags_parser=parse_flags)
