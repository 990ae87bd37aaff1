#!/usr/bin/env bash
# Every GPU check in one run, for a machine lent for minutes: what the machine is, the benchmark
# suite with --platform=gpu, and the transformer at nanoGPT's configuration trained by both twins
# in bf16 with cuDNN attention, compared, with a sample generated through the KV cache.
#
#   pip install -e ".[gpu]"   # once: JAX with CUDA (or a machine whose python3 already has it)
#   SHARD_PARITY_DATA_DIR=../shared/data bash benchmarks/gpu.sh OUT_DIR
#
# Without SHARD_PARITY_DATA_DIR, training downloads tiny Shakespeare (checksum-verified) first.
# OUT_DIR receives results_gpu.{json,md}, attention_gpu.png, sweep_gpu.png, the two runs'
# metrics_{auto,explicit}.jsonl, gpu.log (everything printed) and the GPUs' target config: the
# compiler's description of them, which lets `python -m inspector --target=h200x8` compile for
# them on a machine without a GPU (it is written to inspector/target_configs/, to be committed,
# and copied to OUT_DIR; docs/inspector.md). A step that fails is logged and
# the next one still runs, so one failure does not cost the rest of the lease; the script exits
# non-zero if any step failed.
set -uo pipefail
out=$(realpath -m "${1:?usage: bash benchmarks/gpu.sh OUT_DIR}")
cd "$(dirname "$0")/.." || exit 1  # the repository root: `python -m benchmarks.run` needs it
mkdir -p "$out"
log=$out/gpu.log
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
runs=$(mktemp -d)  # checkpoints stay here; only the metrics are copied out
trap 'rm -rf "$runs"' EXIT
failed=()

source benchmarks/steps.sh  # step SECONDS COMMAND...: timed, logged, failures kept

step 60 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
  --format=csv
step 120 "$py" -c 'import jax, flax, optax, orbax.checkpoint as ocp, sys
print(sys.version.split()[0], "jax", jax.__version__, "flax", flax.__version__, "optax",
      optax.__version__, "orbax", ocp.__version__)
print(jax.devices())'
step 60 "$py" -c 'import shutil, sys
from shard_parity.inspector.target import capture_gpu_config
path = capture_gpu_config()
print("captured", path)
shutil.copy(path, sys.argv[1])' "$out"
step 300 "$py" -m benchmarks.run --platform=gpu --rounds=11 --out="$out"
for twin in auto explicit; do
  step 120 "$py" -m "$twin.train" --model=transformer --dtype=bfloat16 --attention=fused \
    --workdir="$runs/$twin"
  if [ -f "$runs/$twin/metrics.jsonl" ]; then
    cp "$runs/$twin/metrics.jsonl" "$out/metrics_$twin.jsonl"
  fi
done
step 30 "$py" -m parity_tests.compare "$runs/auto" "$runs/explicit"
step 45 "$py" -m auto.generate --workdir="$runs/auto" --prompt="ROMEO:" --max_new_bytes=300 \
  --temperature=0.8 --top_k=40 --seed=0 --kv_cache
if [ ${#failed[@]} -gt 0 ]; then
  echo "== failed: ${failed[*]} (see $log)" | tee -a "$log"
  exit 1
fi
