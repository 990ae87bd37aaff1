"""The train CLI's flags, defined once: `auto.train` and `explicit.train` take the same ones.

Training flags left unset take the model's defaults from shard_parity/config.py (TRAIN_DEFAULTS):
the MLP's MNIST recipe, or nanoGPT's shakespeare_char CPU recipe for the transformer.
"""

import dataclasses

from absl import flags

from shard_parity import UsageError
from shard_parity import config as cfg
from shard_parity.placement import STRATEGIES

MODEL = flags.DEFINE_enum('model', 'mlp', ['mlp', 'transformer'], 'Which model to train.')
STRATEGY = flags.DEFINE_enum(
    'strategy',
    'dp',
    list(STRATEGIES),
    'dp: replicated state (<twin>/train_step.py); fsdp: parameters and optimizer state '
    "sharded over 'data' too (<twin>/fsdp.py); tp: layers split over 'model', Megatron style "
    '(<twin>/tp.py); fsdp_tp: both (<twin>/fsdp_tp.py). See shard_parity/placement.py.',
)
MESH = flags.DEFINE_string(
    'mesh',
    None,
    "DATAxMODEL devices, e.g. 4x2: the batch is split over 'data', tensor parallelism over "
    "'model'. Default: all devices (or --num_devices) x 1.",
)
STEPS = flags.DEFINE_integer('steps', None, 'Total training steps.', lower_bound=1)
BATCH_SIZE = flags.DEFINE_integer(
    'batch_size', None, 'Global batch size, split evenly over the devices.', lower_bound=1
)
LEARNING_RATE = flags.DEFINE_float(
    'learning_rate', None, 'Peak AdamW learning rate.', lower_bound=0.0
)
WEIGHT_DECAY = flags.DEFINE_float(
    'weight_decay', None, 'AdamW decay of weight matrices (not biases or norms).', lower_bound=0.0
)
BETA2 = flags.DEFINE_float(
    'beta2', None, "AdamW's second-moment decay.", lower_bound=0.0, upper_bound=1.0
)
WARMUP_STEPS = flags.DEFINE_integer('warmup_steps', None, 'Linear warm-up steps.', lower_bound=0)
DECAY_STEPS = flags.DEFINE_integer(
    'decay_steps', None, 'Cosine decay length (default: --steps).', lower_bound=1
)
MIN_LEARNING_RATE = flags.DEFINE_float(
    'min_learning_rate', None, 'Learning rate at the end of the cosine decay.', lower_bound=0.0
)
GRAD_CLIP = flags.DEFINE_float(
    'grad_clip', None, 'Clip the global gradient norm to this (0: off).', lower_bound=0.0
)
SEED = flags.DEFINE_integer('seed', 0, 'Seeds the init and the batch order.', lower_bound=0)
LOG_EVERY = flags.DEFINE_integer(
    'log_every', None, 'Log the train loss every N steps.', lower_bound=1
)
EVAL_EVERY = flags.DEFINE_integer(
    'eval_every', None, 'Evaluate every N steps (and at the end).', lower_bound=1
)

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
    'Attention implementation (shard_parity/attention.py).',
)
DTYPE = flags.DEFINE_enum(
    'dtype',
    _T.dtype,
    ['float32', 'bfloat16'],
    'Compute dtype; parameters and the optimizer stay float32.',
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
    'auto and explicit twins round identically and stay bitwise equal (shard_parity/mesh.py).',
)
NUM_DEVICES = flags.DEFINE_integer(
    'num_devices', None, 'Use only the first N devices for the mesh (default: all).', lower_bound=1
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
    'Where metrics.jsonl, reports and the checkpoint go. Default: runs/<twin>_<model>.',
)
CHECKPOINT_EVERY = flags.DEFINE_integer(
    'checkpoint_every',
    None,
    'Save a checkpoint every N steps (default: at each evaluation) and '
    'at the end. A rerun with the same --workdir resumes from the latest.',
    lower_bound=1,
)
KEEP = flags.DEFINE_integer('keep', 3, 'How many checkpoints to keep.', lower_bound=1)
DEBUG_NANS = flags.DEFINE_bool('debug_nans', False, "Turn on JAX's NaN checks (slow).")
VERBOSE = flags.DEFINE_bool('verbose', False, 'Show the traceback of an expected error too.')
# Several processes (one per host, or several on one machine: python -m parity_tests.launch).
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
SHOW_SHARDING = flags.DEFINE_bool(
    'show_sharding', False, 'Print where one batch and one weight live on the devices.'
)


def mesh_shape() -> tuple[int, int] | None:
    """--mesh=4x2 -> (4, 2); None when unset (then --num_devices x 1)."""
    if MESH.value is None:
        return None
    parts = MESH.value.lower().split('x')
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UsageError(
            f'--mesh={MESH.value}: expected DATAxMODEL, two positive integers such as 4x2'
        )
    shape = (int(parts[0]), int(parts[1]))
    if NUM_DEVICES.value is not None and NUM_DEVICES.value != shape[0] * shape[1]:
        raise UsageError(
            f'--num_devices={NUM_DEVICES.value} and --mesh={MESH.value} '
            f'({shape[0] * shape[1]} devices) disagree: give one of them'
        )
    return shape


def train_config() -> cfg.TrainConfig:
    """The model's defaults, overridden by every training flag given."""
    given = {
        'steps': STEPS,
        'batch_size': BATCH_SIZE,
        'learning_rate': LEARNING_RATE,
        'weight_decay': WEIGHT_DECAY,
        'beta2': BETA2,
        'warmup_steps': WARMUP_STEPS,
        'decay_steps': DECAY_STEPS,
        'min_learning_rate': MIN_LEARNING_RATE,
        'grad_clip': GRAD_CLIP,
        'seed': SEED,
        'log_every': LOG_EVERY,
        'eval_every': EVAL_EVERY,
    }
    changes = {k: f.value for k, f in given.items() if f.value is not None}
    return dataclasses.replace(cfg.TRAIN_DEFAULTS[MODEL.value], **changes)


def transformer_config() -> cfg.TransformerConfig:
    return cfg.TransformerConfig(
        seq_len=SEQ_LEN.value,
        num_layers=NUM_LAYERS.value,
        num_heads=NUM_HEADS.value,
        num_kv_heads=NUM_KV_HEADS.value or NUM_HEADS.value,
        embed_dim=EMBED_DIM.value,
        attention=ATTENTION.value,
        dtype=DTYPE.value,
    )
