#!/usr/bin/env bash
# Every TPU benchmark in one short run (estimated 6-8 minutes with the compiles on one v5e chip;
# not yet timed there), as gpu.sh is for GPUs: what the machine is, then `python -m
# benchmarks.run --platform=tpu`: the
# one-device step's memory on the chip against its compiler's figure (chip_memory), the twins
# side by side with the one-device reference (the MLP, and the transformer at nanoGPT's
# configuration in bf16), the attention sweep, the nanoGPT configuration, and the GPT-2-small
# shape in the three twins (mfu). Every timed row carries model TFLOP/s and MFU against the
# chip's peak (shard_parity/runtime/flops.py).
#
#   pip install -e ".[tpu]"   # once: JAX with libtpu
#   bash benchmarks/tpu.sh OUT_DIR [more flags of benchmarks.run, e.g. --mfu_steps=50]
#
# (`python -m benchmarks.run --platform=tpu` alone runs the same sections in one process.)
#
# OUT_DIR receives results_tpu.{json,md} (the chip, jax, libtpu and the date in their header),
# attention_tpu.png where matplotlib is installed, and tpu.log (everything printed). On one chip
# the twins' programs have no collectives: their agreement there says nothing about parallelism.
# A step that fails is logged and the next still runs; the script exits non-zero if any failed.
set -uo pipefail
out=$(realpath -m "${1:?usage: bash benchmarks/tpu.sh OUT_DIR [benchmark flags]}")
shift
cd "$(dirname "$0")/.." || exit 1  # the repository root: `python -m benchmarks.run` needs it
mkdir -p "$out"
log=$out/tpu.log
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
failed=()

source benchmarks/steps.sh  # step SECONDS COMMAND...: timed, logged, failures kept

step 120 "$py" -c 'import importlib.metadata as md, sys, jax
def v(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "absent"
print(sys.version.split()[0], "jax", jax.__version__, "libtpu", v("libtpu"), "flax", v("flax"))
print(jax.devices())'
# two processes (one holds the chip at a time), each merging its sections into results_tpu.json:
# a run stopped by its limit keeps what the other wrote. chip_memory comes first in a fresh one.
step "${TPU_LIMIT_A:-300}" "$py" -m benchmarks.run --platform=tpu --rounds=10 --out="$out" \
  --sections=chip_memory,twins,attention,nanogpt "$@"
step "${TPU_LIMIT_B:-300}" "$py" -m benchmarks.run --platform=tpu --out="$out" --sections=mfu "$@"
if [ ${#failed[@]} -gt 0 ]; then
  echo "== failed: ${failed[*]} (see $log)" | tee -a "$log"
  exit 1
fi
