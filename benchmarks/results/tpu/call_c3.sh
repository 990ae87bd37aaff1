#!/bin/bash
# Session 11, last chip call: the GPT-2-small step profiled with the ops' categories read from
# its compiled HLO (profile_step.py), 60 steps (the median of 58), then the same with splash's
# fused backward (one kernel for dq, dk, dv: a lever), then, if time is left, blocks of 256.
source benchmarks/results/tpu/setup.sh
R=/tmp/rc3; mkdir -p $R; O=/tmp/oc3; rm -rf $O; mkdir -p $O; T0=$(date +%s)
G="--model=transformer --embed_dim=768 --num_layers=12 --num_heads=12 --seq_len=1024 --batch_size=16 --dtype=bfloat16 --attention=fused --eval_every=1000 --steps=60"
p() { local name=$1; shift; local s=$(date +%s); mkdir -p $O/$name
  env "$@" timeout 170 python3 benchmarks/results/tpu/profile_step.py auto $O/$name -- $G --workdir=$R/$name > $O/$name/out.txt 2> $O/$name/err.txt
  echo "$name rc=$? wall=$(( $(date +%s)-s ))s: $*" | tee -a $OUT/times.txt
  grep '"final"' $O/$name/out.txt; sed -n '/XLA ops over/,/top 30/p' $O/$name/out.txt
  tail -3 $O/$name/err.txt > $O/$name/errtail.txt; rm -rf $O/$name/err.txt $O/$name/trace_auto; }
date -u > $OUT/times.txt
p base SPLASH_FUSED=0
p fused SPLASH_FUSED=1
[ $(( $(date +%s)-T0 )) -lt 260 ] && p block256 SPLASH_BLOCK=256
tar -czf $OUT/c3.tgz -C $O .
ls -la $OUT
