#!/bin/bash
# Item 5 of issue 53: the inspector on the chip, for the three one-device configurations of
# benchmarks/chip.py (INSPECTOR_FLAGS): its JSON (on a TPU host it compiles for the chip it runs
# on, target tpu-v5e-1, with memory per program) and --measure_memory (the one-device step run
# once, memory_stats()' peak beside the compiler's). $OUT/inspector_<config>.json, each
# command's stderr tail in $OUT/inspector_<config>.err.
source benchmarks/results/tpu/setup.sh
declare -A FLAGS=(
  [mlp]="--model=mlp"
  [nanogpt_bf16]="--model=transformer --dtype=bfloat16"
  [six_layers_bf16]="--model=transformer --dtype=bfloat16 --num_layers=6 --embed_dim=384 --num_heads=6 --seq_len=256 --batch_size=64"
)
date -u > "$OUT/inspector_date.txt"
timeout 60 python3 -c 'import importlib.metadata as md, jax; print("jax", jax.__version__, "libtpu", md.version("libtpu"), jax.devices())' >> "$OUT/inspector_date.txt" 2>&1
for name in mlp nanogpt_bf16 six_layers_bf16; do
  t=$(date +%s)
  timeout 120 python3 -m inspector ${FLAGS[$name]} --strategy=dp --measure_memory --json \
    > "$OUT/inspector_$name.json" 2> "$OUT/inspector_$name.full.err"
  echo "$name exit $? after $(( $(date +%s) - t )) s" >> "$OUT/inspector_date.txt"
  tail -20 "$OUT/inspector_$name.full.err" > "$OUT/inspector_$name.err"; rm -f "$OUT/inspector_$name.full.err"
done
date -u >> "$OUT/inspector_date.txt"
