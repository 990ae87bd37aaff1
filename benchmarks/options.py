"""The flags of `python -m benchmarks.run` (benchmarks/run.py declares them its key flags, so that
its --help lists them), the sections they choose from, and the checks of their values that run
before any section does (bad input: one line, exit 2)."""

from absl import flags

from benchmarks import CHIP_ONLY, DEFAULT_SECTIONS, SECTIONS, TPU_SECTIONS
from shard_parity import exit_status, refuse
from shard_parity.inspector.target import TARGETS

NANOGPT_DEVICES = 2  # one device per core of the 2-core machines nanoGPT's ~45 ms was timed on
SECTION = flags.DEFINE_list(
    'sections',
    DEFAULT_SECTIONS,
    f'Which of {SECTIONS} to run. With --platform=tpu the default is {TPU_SECTIONS} (mfu: '
    'the GPT-2-small shape in the three twins; chip_memory: the one-device step\'s peak on the '
    'chip against its compiler\'s, benchmarks/chip.py; both need a TPU or GPU). Otherwise the '
    'default is all but those two, context (context parallelism at T = 4,096 '
    'to 16,384: minutes of compiling; python -m benchmarks.run --sections=context), cli '
    '(whole train CLI runs: about 20 minutes at the defaults), memory (24 compiles: every '
    'twin x strategy at 2 and 4 layers, benchmarks/memory.py) and memory_101m (the README\'s '
    '101M-parameter transformer under dp, fsdp and fsdp_tp, the three twins) and remat (each '
    '--remat_policy\'s compiled temp memory and step time, benchmarks/remat.py).',
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
    ['cpu', 'gpu', 'tpu'],
    'cpu: 8 emulated CPU devices; gpu: the real GPUs, bf16, cuDNN; tpu: the real TPU chips, '
    'bf16, --attention=fused (results_tpu.*; benchmarks/tpu.sh).',
)
MFU_STEPS = flags.DEFINE_integer(
    'mfu_steps', 60, 'Section mfu: steps timed per twin, one a round, interleaved (after two of '
    'warm-up); the median is reported.', lower_bound=1
)  # fmt: skip
OUT = flags.DEFINE_string(
    'out',
    'benchmarks/results',
    'Folder for the results: a run of some sections merges into the results.json recorded '
    'there. With --target nothing is written unless --out is given.',
)
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


def sections() -> list[str]:
    """--sections, or the platform's default where it is not given."""
    if PLATFORM.value == 'tpu' and not flags.FLAGS[SECTION.name].present:
        return list(TPU_SECTIONS)
    return list(SECTION.value)


def check_flags() -> None:
    """The section list and --target's sections, before anything starts."""
    if not SECTION.value:
        refuse(f'--sections is empty: name one or more of {", ".join(SECTIONS)}')
    unknown = set(SECTION.value) - set(SECTIONS)
    if unknown:
        refuse(f'--sections has {sorted(unknown)}; choose from {SECTIONS}')
    chip = sorted(set(SECTION.value) & set(CHIP_ONLY))
    if chip and PLATFORM.value == 'cpu' and flags.FLAGS[SECTION.name].present:
        refuse(
            f'--sections has {chip}, which need a chip (GPT-2 small\'s step; memory_stats(), '
            'which XLA:CPU has not): give --platform=tpu or --platform=gpu'
        )
    compiled_only = {'memory', 'memory_101m', 'context'}
    if TARGET.value and set(SECTION.value) - compiled_only:
        refuse(
            f'--target={TARGET.value} compiles sections {sorted(compiled_only)} only; '
            f'--sections has {sorted(set(SECTION.value) - compiled_only)}'
        )


def check_data() -> None:
    """Section cli trains on tiny Shakespeare (in a child process): its file is found, or
    downloaded, before the first section runs, and a missing one is the train CLI's line and
    exit status (1, docs/errors.md), not a child's traceback after the sections before it."""
    from shard_parity.datasets import shakespeare
    from shard_parity.datasets.root import DataError, data_root

    try:
        shakespeare.load(data_root())  # where benchmarks/cli.py's runs read it
    except DataError as e:
        refuse(str(e), exit_status(e))
