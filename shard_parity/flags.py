"""The train CLI's flags, defined once: `auto.train` and `explicit.train` take the same ones."""

from absl import flags

MODEL = flags.DEFINE_enum('model', 'mlp', ['mlp'], 'Which model to train.')
STEPS = flags.DEFINE_integer('steps', 600, 'Total training steps.', lower_bound=1)
BATCH_SIZE = flags.DEFINE_integer(
    'batch_size', 128, 'Global batch size, split evenly over the devices.', lower_bound=1
)
LEARNING_RATE = flags.DEFINE_float('learning_rate', 1e-3, 'AdamW learning rate.', lower_bound=0.0)
WEIGHT_DECAY = flags.DEFINE_float(
    'weight_decay', 1e-4, 'AdamW decay of weight matrices.', lower_bound=0.0
)
SEED = flags.DEFINE_integer('seed', 0, 'Seeds the init and the batch order.')
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
    'workdir', None, 'Where metrics.jsonl and reports go. Default: runs/<twin>_<model>.'
)
LOG_EVERY = flags.DEFINE_integer(
    'log_every', 50, 'Log the train loss every N steps.', lower_bound=1
)
EVAL_EVERY = flags.DEFINE_integer(
    'eval_every', 200, 'Evaluate every N steps (and at the end).', lower_bound=1
)
SHOW_SHARDING = flags.DEFINE_bool(
    'show_sharding', False, 'Print where one batch and one weight live on the devices.'
)
