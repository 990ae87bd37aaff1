"""The generate CLI's flags, defined once: `auto.generate` and `explicit.generate` take the same."""

from absl import flags

WORKDIR = flags.DEFINE_string(
    'workdir', None, 'The training workdir holding checkpoints/.', required=True
)
PROMPT = flags.DEFINE_string('prompt', '', 'Text to continue (UTF-8); may be empty.')
MAX_NEW_BYTES = flags.DEFINE_integer('max_new_bytes', 200, 'Bytes to generate.', lower_bound=0)
TEMPERATURE = flags.DEFINE_float(
    'temperature', 0.8, 'Sampling temperature; 0 is greedy.', lower_bound=0.0
)
TOP_K = flags.DEFINE_integer(
    'top_k', None, 'Sample among the k likeliest bytes only.', lower_bound=1, upper_bound=256
)
SEED = flags.DEFINE_integer('seed', 0, 'Sampling seed.', lower_bound=0)
KV_CACHE = flags.DEFINE_bool('kv_cache', False, 'Decode with a KV cache (one position per byte).')
CPU_DEVICES = flags.DEFINE_integer(
    'cpu_devices', None, 'Run on the CPU (see the train CLI).', lower_bound=1
)
