#!/bin/bash
# Remat policies on the chip, second call: the largest batch per policy, exact, searching on
# from the first call's compiles (remat_r1.json: batches 16 and 32 of each policy; its run of
# remat.sh stopped after them, at its DEADLINE=170). --remat_policy=none is now the unrolled
# layers without a checkpoint (on one device the unset step, r1's "default"), so r1's default
# compiles stand for none's; r1's none (the scan without a checkpoint) is not searched again.
# No timing (r1 timed every policy at batch 16). ~3 minutes. Results: $OUT/remat2.json,
# $OUT/remat2.txt (the summary), $OUT/remat2.err (every compile's figures as they come).
source benchmarks/results/tpu/setup.sh
G="--model=transformer --embed_dim=768 --num_layers=12 --num_heads=12 --seq_len=1024 --dtype=bfloat16 --attention=fused"
date -u | tee $OUT/remat2.txt
python3 - <<'PY'
import json
r1 = json.load(open('benchmarks/results/tpu/remat_r1.json'))
p = r1['policies']
p['none'] = p.pop('default')  # the unrolled step without a checkpoint: none's program now
json.dump(r1, open('/tmp/remat_known.json', 'w'))
PY
t=$(date +%s)
timeout 390 python3 -m benchmarks.remat $G --batch_size=16 --timed_steps=0 --nowith_default \
  --fit_known=/tmp/remat_known.json --deadline_s=${DEADLINE:-300} --compile_workers=${WORKERS:-6} \
  ${EXTRA:-} --out=$OUT/remat2.json >> $OUT/remat2.txt 2> $OUT/remat2.err
echo "rc=$? wall=$(( $(date +%s)-t ))s" | tee -a $OUT/remat2.txt
tail -3 $OUT/remat2.err >> $OUT/remat2.txt
