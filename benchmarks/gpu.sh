#!/usr/bin/env bash
# Every GPU check in one run, for a machine lent for minutes: what the machine is, the benchmark
# suite with --platform=gpu, and the transformer at nanoGPT's configuration trained by both twins
# in bf16 with cuDNN attention, compared, with a sample generated through the KV cache.
#
#   SHARD_PARITY_DATA_DIR=../shared/data bash benchmarks/gpu.sh OUT_DIR
#
# OUT_DIR receives results_gpu.{json,md}, attention_gpu.png, sweep_gpu.png, the two runs'
# metrics.jsonl and gpu.log (everything printed). A step that fails is logged and the next one
# still runs, so one failure does not cost the rest of the lease.
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu.sh OUT_DIR}
mkdir -p "$out"
log=$out/gpu.log
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
runs=$(mktemp -d)  # checkpoints stay here; only the metrics are copied out

step() {  # step SECONDS COMMAND...: run it under a time limit, log it, report its exit status
  local limit=$1
  shift
  echo "== $* (limit ${limit}s)" | tee -a "$log"
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  echo "== exit ${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$log"
}

step 60 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
  --format=csv
step 120 "$py" -c 'import jax, flax, optax, orbax.checkpoint as ocp, sys
print(sys.version.split()[0], "jax", jax.__version__, "flax", flax.__version__, "optax",
      optax.__version__, "orbax", ocp.__version__)
print(jax.devices())'
step 300 "$py" -m benchmarks.run --platform=gpu --rounds=11 --out="$out"
for twin in auto explicit; do
  step 120 "$py" -m "$twin.train" --model=transformer --dtype=bfloat16 --attention=fused \
    --workdir="$runs/$twin"
  cp "$runs/$twin/metrics.jsonl" "$out/metrics_$twin.jsonl"
done
step 30 "$py" -m parity_tests.compare "$runs/auto" "$runs/explicit"
step 45 "$py" -m auto.generate --workdir="$runs/auto" --prompt="ROMEO:" --max_new_bytes=300 \
  --temperature=0.8 --top_k=40 --seed=0 --kv_cache
