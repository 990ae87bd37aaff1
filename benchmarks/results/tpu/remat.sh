#!/bin/bash
# Remat policies on the chip (issue 54, item 3): the GPT-2-small shape in bf16 with fused
# attention, the auto twin on one device. Per --remat_policy (and unset, as before the flag):
# the largest batch whose compiled step fits the chip's HBM (compile only: memory_analysis(),
# the line through batches 16 and 32 to the HBM, then the batches around it), and the median of
# 30 steps at batch 16 with tokens/s and MFU. benchmarks/remat.py does it all in one process
# (compiles in 6 threads); ~5 minutes. Results: $OUT/remat.json, $OUT/remat.txt (the summary),
# $OUT/remat.err (every compile's figures as they come).
source benchmarks/results/tpu/setup.sh
G="--model=transformer --embed_dim=768 --num_layers=12 --num_heads=12 --seq_len=1024 --dtype=bfloat16 --attention=fused"
date -u | tee $OUT/remat.txt
t=$(date +%s)
timeout 390 python3 -m benchmarks.remat $G --batch_size=${BATCH:-16} --timed_steps=${STEPS:-30} \
  --fit_start=${START:-16,32} --deadline_s=${DEADLINE:-290} --compile_workers=${WORKERS:-6} \
  ${EXTRA:-} --out=$OUT/remat.json >> $OUT/remat.txt 2> $OUT/remat.err
echo "rc=$? wall=$(( $(date +%s)-t ))s" | tee -a $OUT/remat.txt
tail -3 $OUT/remat.err >> $OUT/remat.txt
