#!/bin/bash
# Splash attention (--attention=fused on a TPU, shard_parity/model/splash.py) on the chip:
# parity with naive in bf16 (forward, gradients), compiled memory against T, attention's own
# time and TFLOP/s at the GPT-2-small shape (splash_bench.py: $OUT/splash.jsonl), then the
# GPT-2-small train step (60 steps) in the three twins with --attention=fused ($OUT/splash.txt,
# each run's stderr tail in $OUT/<twin>.err). About 7 minutes: the bench ~110 s, each
# twin ~105 s (45 s of it compiling, 20 s the final evaluation's compile).
set -u
source benchmarks/results/tpu/setup.sh
R=/tmp/splash_runs; mkdir -p $R
date -u | tee $OUT/splash.txt
T0=$(date +%s)
timeout 170 python3 benchmarks/results/tpu/splash_bench.py $OUT > $R/bench.out 2> $R/bench.err
echo "bench rc=$? wall=$(( $(date +%s)-T0 ))s" | tee -a $OUT/splash.txt
tail -5 $R/bench.err > $OUT/bench.err
G="--model=transformer --embed_dim=768 --num_layers=12 --num_heads=12 --seq_len=1024 --batch_size=16 --dtype=bfloat16 --steps=60 --attention=fused"
for twin in typed auto explicit; do  # typed first: the one not yet run on the chip
  t=$(date +%s)
  timeout 125 python3 -m $twin.train $G --workdir=$R/$twin > $R/$twin.out 2> $R/$twin.err
  echo "$twin rc=$? wall=$(( $(date +%s)-t ))s: python3 -m $twin.train $G" | tee -a $OUT/splash.txt
  tail -1 $R/$twin.out | tee -a $OUT/splash.txt
  grep -i "attention" $R/$twin.err | head -3 | tee -a $OUT/splash.txt
  tail -3 $R/$twin.err > $OUT/$twin.err
done
echo "total wall=$(( $(date +%s)-T0 ))s" | tee -a $OUT/splash.txt
