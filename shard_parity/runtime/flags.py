"""Every CLI flag, defined once: the train and generate CLIs of every twin take these, and the
two sets coexist in one process.

The training flags are made from shard_parity/config.py's TrainConfig, one per field
(its help and bounds come from the field); left unset, they take the model's defaults
(TRAIN_DEFAULTS: the MLP's MNIST recipe, or nanoGPT's shakespeare_char CPU recipe). Each CLI
lists its own flags under --help (TRAIN_CLI, GENERATE_CLI: absl's key flags of the program run);
--helpfull lists every flag of every module. What the parsed flags make (the plan, the
configurations) is shard_parity/runtime/from_flags.py, the one module that reads these flags'
values to build the plan (shard_parity/plan.py).
"""

import dataclasses
import math
import typing

from absl import flags

from shard_parity import plan as plans
from shard_parity.plan import STRATEGIES
from shard_parity import config as cfg
from shard_parity.model.transformer import REMAT_POLICIES

MODEL = flags.DEFINE_enum('model', 'mlp', ['mlp', 'transformer'], 'Which model to train.')
STRATEGY_HELP = {
    'dp': 'replicated state (<twin>/dp.py)',
    'fsdp': "the batch, parameters and optimizer state split over 'fsdp' (<twin>/fsdp.py)",
    'tp': "layers split over 'model', Megatron style, the batch over 'data' (<twin>/tp.py)",
    'fsdp_tp': "both: fsdp over 'fsdp', tp over 'model' (<twin>/fsdp_tp.py)",
    'cp': "each sequence split over the mesh's second axis, 'seq' (<twin>/cp.py, transformer only)",
    'pp': "the layers split into stages over the mesh's second axis, 'stage' (<twin>/pp.py, "
    'transformer only)',
    'ep': "experts split over the mesh's second axis, 'expert', the batch over both (<twin>/ep.py, "
    'transformer with --num_experts only)',
    'composed': 'every axis a named --mesh gives (<twin>/composed.py; the default for a named '
    'mesh no single strategy covers)',
}


def _strategy_help(names) -> str:
    text = '; '.join(f'{n}: {STRATEGY_HELP.get(n, "<twin>/" + n + ".py")}' for n in names)
    return (
        f'{text}. Each is a name for a mesh: --strategy=fsdp_tp --mesh=4x2 is '
        '--mesh=fsdp:4,model:2; a named --mesh picks the file itself (shard_parity/plan.py).'
    )


STRATEGY = flags.DEFINE_enum('strategy', 'dp', list(STRATEGIES), _strategy_help(STRATEGIES))
MESH = flags.DEFINE_string(
    'mesh',
    None,
    'The mesh: named axes as name:size pairs separated by commas, e.g. data:2,fsdp:2,model:2 '
    '(any of ' + '; '.join(f'{a}: {d}' for a, d in plans.DOES.items()) + '). Each axis at most '
    'once, in any order: the order lays the devices out, the first axis varying slowest, so '
    'the last axis\'s groups are neighbouring devices (put the busiest axis last); names are '
    'case-insensitive and spaces around them are ignored. The sizes multiply to the device '
    'count (or --num_devices); the file that covers the axes runs, else <twin>/composed.py. '
    'Or the legacy AxB: --strategy\'s two axes, '
    'DATAxMODEL for dp and tp, FSDPxMODEL for fsdp and fsdp_tp, DATAxSEQ for cp, DATAxSTAGE '
    'for pp, DATAxEXPERT for ep (--strategy=fsdp_tp --mesh=4x2 is --mesh=fsdp:4,model:2). '
    'Default: all devices (or --num_devices) on --strategy\'s first axis.',
)


SHOWN_DEFAULTS = {
    'warmup_steps': '0 (mlp), min(100, steps // 10) (transformer; a resumed run keeps its own)'
}


def _define_train_flags() -> dict:
    """One flag per TrainConfig field, None by default: the model's value applies."""
    out = {}
    for field in dataclasses.fields(cfg.TrainConfig):
        is_float = field.type is float or float in typing.get_args(field.type)
        define = flags.DEFINE_float if is_float else flags.DEFINE_integer
        if field.type is bool:
            define = lambda name, default, help, **bounds: flags.DEFINE_bool(name, default, help)  # noqa: E731
        values = {model: getattr(c, field.name) for model, c in cfg.TRAIN_DEFAULTS.items()}
        shown = SHOWN_DEFAULTS.get(field.name) or (
            f'{next(iter(values.values()))}'
            if len(set(values.values())) == 1
            else ', '.join(f'{v} ({m})' for m, v in values.items())
        )
        out[field.name] = define(
            field.name,
            None,
            f"{field.metadata['help']} Default: {shown}.",
            lower_bound=field.metadata['lower'],
            upper_bound=field.metadata['upper'],
        )
    return out


TRAIN = _define_train_flags()  # name -> FlagHolder, e.g. TRAIN['steps'].value

# The transformer's shape (ignored by --model=mlp).
_T = cfg.TransformerConfig()
SEQ_LEN = flags.DEFINE_integer('seq_len', _T.seq_len, 'Context length in bytes.', lower_bound=1)
NUM_LAYERS = flags.DEFINE_integer('num_layers', _T.num_layers, 'Transformer blocks.', lower_bound=1)
NUM_HEADS = flags.DEFINE_integer('num_heads', _T.num_heads, 'Query heads.', lower_bound=1)
NUM_KV_HEADS = flags.DEFINE_integer(
    'num_kv_heads',
    None,
    'Key/value heads: = num_heads (MHA, default), a divisor (GQA), 1 (MQA).',
    lower_bound=1,
)
EMBED_DIM = flags.DEFINE_integer('embed_dim', _T.embed_dim, 'Model width.', lower_bound=1)
ATTENTION = flags.DEFINE_enum(
    'attention',
    _T.attention,
    ['naive', 'fused'],
    'naive: the [B, H, T, T] score matrix; fused: cuDNN flash attention on an NVIDIA GPU in '
    'bfloat16, elsewhere (the CPU, or float32) the same algorithm in plain JAX (blockwise: a '
    'scan over key blocks with an online softmax), memory linear in --seq_len '
    '(shard_parity/model/attention.py).',
)
# The precision policy (docs/numerics.md; FSDP2's param_dtype/reduce_dtype, jmp's compute).
DTYPE = flags.DEFINE_enum(
    'dtype',
    _T.dtype,
    ['float32', 'bfloat16'],
    "Compute dtype (Flax's dtype, FSDP2's param_dtype, jmp's compute): the layers' arithmetic "
    'and, under fsdp, the weights each all-gather moves. Master parameters and the AdamW state '
    'stay float32; logits, softmax, the loss and the router compute in float32.',
)
REDUCE_DTYPE = flags.DEFINE_enum(
    'reduce_dtype',
    'float32',
    ['float32', 'bfloat16'],
    "The dtype the gradients' collectives carry (FSDP2's reduce_dtype): the all-reduces and "
    "reduce-scatters of the weight gradients over the batch's axes. Needs a mesh that reduces "
    'something (an axis over the batch of 2 or more devices).',
)
MATMUL_PRECISION = flags.DEFINE_enum(
    'matmul_precision',
    'default',
    ['default', 'high', 'highest'],
    "jax's default_matmul_precision for float32 dots: on a TPU, default is one bfloat16 pass "
    '(high: three, highest: six); GPUs may use TF32 at default. The CPU computes float32 dots '
    'in float32 at every setting.',
)
NUM_EXPERTS = flags.DEFINE_integer(
    'num_experts',
    _T.num_experts,
    'Mixture of experts: this many expert feed-forward networks per block, each token routed '
    'to its top --experts_per_token (shard_parity/model/moe.py); 0: the dense model.',
    lower_bound=0,
)
EXPERTS_PER_TOKEN = flags.DEFINE_integer(
    'experts_per_token', _T.experts_per_token, 'K: the experts each token goes to.'
)
CAPACITY_FACTOR = flags.DEFINE_float(
    'capacity_factor',
    _T.capacity_factor,
    'Each expert takes ceil(factor * seq_len * K / num_experts) tokens per sequence; the rest '
    'are dropped (first choices before second, then by position).',
)
REMAT_POLICY = flags.DEFINE_enum(
    'remat_policy',
    _T.remat_policy,
    list(REMAT_POLICIES),
    'What each transformer block keeps for the backward; the rest is recomputed there '
    '(jax.checkpoint per block, docs/remat.md): '
    + '; '.join(f'{k}: {v or "no jax.checkpoint"}' for k, v in REMAT_POLICIES.items())
    + ' (jax.checkpoint_policies). Default: full under fsdp\'s per-layer gather, none elsewhere, '
    'what each path kept before the flag. --model=mlp takes none or no value.',
)

# Devices, data and outputs.
CPU_DEVICES = flags.DEFINE_integer(
    'cpu_devices',
    None,
    'Emulate this many CPU devices and train on the CPU. Default: 8 emulated CPU devices when '
    'the machine has no accelerator, else the real devices.',
    lower_bound=1,
)
CPU_FMA = flags.DEFINE_bool(
    'cpu_fma',
    False,
    'Let XLA use fused multiply-adds on the CPU. Off by default, so that the '
    'auto and explicit twins round identically and stay bitwise equal (shard_parity/devices.py).',
)
NUM_DEVICES = flags.DEFINE_integer(
    'num_devices',
    None,
    'Use only the first N devices for the mesh. Default: all, or, when the default batch does not '
    'split over all (the transformer\'s 12 on 8 emulated CPU devices), the most it splits over.',
    lower_bound=1,
)
DATA_DIR = flags.DEFINE_string(
    'data_dir',
    None,
    'Folder holding mnist/ and tinyshakespeare/. Default: '
    '$SHARD_PARITY_DATA_DIR, else ~/.cache/shard-parity (downloaded on first use).',
)
DOWNLOAD = flags.DEFINE_bool(
    'download', True, 'Download missing data files (checksum-verified) into the data folder.'
)
WORKDIR = flags.DEFINE_string(
    'workdir',
    None,
    'Where metrics.jsonl, reports and the checkpoints go (generate reads the checkpoints '
    'there). Default: runs/<twin>_<model>.',
)
CHECKPOINT_EVERY = flags.DEFINE_integer(
    'checkpoint_every',
    None,
    'Save a checkpoint every N steps (default: at each evaluation) and '
    'at the end. A rerun with the same --workdir resumes from the latest.',
    lower_bound=1,
)
SAVE_INITIAL = flags.DEFINE_bool(
    'save_initial',
    False,
    'Also save the initial state as a step-0 checkpoint, so that python -m tools.bisect '
    'RUN_A RUN_B can replay from the start.',
)
KEEP = flags.DEFINE_integer('keep', 3, 'How many checkpoints to keep.', lower_bound=1)
DEBUG_NANS = flags.DEFINE_bool('debug_nans', False, "Turn on JAX's NaN checks (slow).")
VERBOSE = flags.DEFINE_bool(
    'verbose', False,
    'Show the traceback of an expected error too, and libtpu\'s start-up warnings where it is '
    'installed on a machine without a TPU.',
)  # fmt: skip
# Several processes (one per host, or several on one machine: python -m tools.launch).
COORDINATOR = flags.DEFINE_string(
    'coordinator_address', None, 'host:port of process 0, for jax.distributed.initialize.'
)
NUM_PROCESSES = flags.DEFINE_integer(
    'num_processes', None, 'How many processes in all.', lower_bound=1
)
PROCESS_ID = flags.DEFINE_integer(
    'process_id', None, 'This process: 0..num_processes-1.', lower_bound=0
)
DISTRIBUTED_AUTO = flags.DEFINE_bool(
    'distributed_auto', False, 'Let jax.distributed.initialize detect the cluster (SLURM, ...).'
)
HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    'heartbeat_timeout',
    30,
    'Seconds before the others give up on a process that died.',
    lower_bound=1,
)
CP_LAYOUT = flags.DEFINE_enum(
    'cp_layout',
    'zigzag',
    ['zigzag', 'contiguous'],
    "With a 'seq' axis (--strategy=cp), which positions each of its n devices holds: "
    'zigzag, chunks i and 2n-1-i of 2n (the same attention work on every device); '
    'contiguous, the i-th n-th (shard_parity/model/ring.py). auto/ ignores it.',
)
MICROBATCHES = flags.DEFINE_integer(
    'microbatches',
    4,
    "With a 'stage' axis (--strategy=pp), the M microbatches each device's rows are cut into: "
    'a GPipe step runs M + S - 1 ticks on S stages, S - 1 of them a bubble (docs/pipeline.md).',
    lower_bound=1,
)
PP_SCHEDULE = flags.DEFINE_enum(
    'pp_schedule',
    'gpipe',
    ['gpipe', '1f1b', 'interleaved'],
    "With --strategy=pp, the pipeline's schedule: gpipe, every microbatch forward then every "
    'backward; 1f1b, one forward and one backward per tick after a warm-up, so a stage keeps '
    'at most 2S - 1 microbatches\' inputs; interleaved, 1f1b with --pp_virtual chunks per '
    'stage, a smaller bubble (docs/pipeline.md).',
)
PP_VIRTUAL = flags.DEFINE_integer(
    'pp_virtual',
    None,
    'With --pp_schedule=interleaved, the V chunks of num_layers / (S x V) layers each stage '
    'runs (default 2): the bubble falls from (S-1)/(M+S-1) to (S-1)/(VM+S-1).',
)
SHARD_OPTIMIZER = flags.DEFINE_bool(
    'shard_optimizer_over_data',
    False,
    "ZeRO-1 (MaxText's name): AdamW's moments split over the 'data' axis, the parameters whole; "
    'the gradients reduce-scattered, each device updates its 1/n, the parameters all-gathered '
    '(runs the composed step on the mesh; docs/zero1.md).',
)
SHOW_SHARDING = flags.DEFINE_bool(
    'show_sharding', False, 'Print where one batch and one weight live on the devices.'
)


def offer_strategies(names) -> None:
    """Lets --strategy take only `names` (a twin's STRATEGIES), in its --help too: another is
    refused by the flag parser in one line, before anything is written."""
    flag = flags.FLAGS[STRATEGY.name]
    flag.parser.enum_values = list(names)
    flag.help = f'<{"|".join(names)}>: {_strategy_help(names)}'


TRANSFORMER_SHAPE = [SEQ_LEN, NUM_LAYERS, NUM_HEADS, NUM_KV_HEADS, EMBED_DIM, ATTENTION]
TRANSFORMER_SHAPE += [NUM_EXPERTS, EXPERTS_PER_TOKEN, CAPACITY_FACTOR, REMAT_POLICY]
PRECISION = [DTYPE, REDUCE_DTYPE, MATMUL_PRECISION]


# Generation (python -m <twin>.generate): it also reads --workdir, --seed (the sampling's),
# --cpu_devices and --verbose.
PROMPT = flags.DEFINE_string('prompt', '', 'Text to continue (UTF-8); may be empty.')
MAX_NEW_BYTES = flags.DEFINE_integer('max_new_bytes', 200, 'Bytes to generate.', lower_bound=0)
TEMPERATURE = flags.DEFINE_float(
    'temperature',
    0.8,
    'Sampling temperature; 0 is greedy, and so is one so small (below ~1e-37) that the logits '
    'divided by it overflow float32.',
    lower_bound=0.0,
)
flags.register_validator(
    TEMPERATURE.name,
    math.isfinite,  # nan passes lower_bound and printed NUL bytes; inf divides logits to nan
    message='--temperature must be a finite number: 0 (greedy) or above',
)
TOP_K = flags.DEFINE_integer(
    'top_k', None, 'Sample among the k likeliest bytes only.', lower_bound=1, upper_bound=256
)
KV_CACHE = flags.DEFINE_bool('kv_cache', False, 'Decode with a KV cache (one position per byte).')

# What each CLI's --help lists; --helpfull lists everything.
TRAIN_CLI = [
    MODEL, STRATEGY, MESH, CP_LAYOUT, MICROBATCHES, PP_SCHEDULE, PP_VIRTUAL, *TRAIN.values(),
    SHARD_OPTIMIZER, *TRANSFORMER_SHAPE, *PRECISION,
    CPU_DEVICES, CPU_FMA,
    NUM_DEVICES, DATA_DIR, DOWNLOAD, WORKDIR, CHECKPOINT_EVERY, SAVE_INITIAL, KEEP, DEBUG_NANS,
    VERBOSE, COORDINATOR, NUM_PROCESSES, PROCESS_ID, DISTRIBUTED_AUTO, HEARTBEAT_TIMEOUT,
    SHOW_SHARDING,
]  # fmt: skip
GENERATE_CLI = [
    WORKDIR, PROMPT, MAX_NEW_BYTES, TEMPERATURE, TOP_K, KV_CACHE, TRAIN['seed'], CPU_DEVICES,
    VERBOSE,
]  # fmt: skip
