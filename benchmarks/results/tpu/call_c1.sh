#!/bin/bash
# Session 11, first chip call: the profile of the GPT-2-small step (where the time goes: issue
# 53 item 3), typed's splash step on the chip (item 1; it failed there before c63eae0), and the
# same shape at batch 32 (a separate row: does MFU rise with the batch?). Results: $OUT/c1.tgz
# (profile summary, the Perfetto trace, each run's last lines), $OUT/times.txt.
source benchmarks/results/tpu/setup.sh
R=/tmp/rc; mkdir -p $R; O=/tmp/oc1; rm -rf $O; mkdir -p $O
t() { local name=$1 lim=$2; shift 2; local s=$(date +%s);
  timeout $lim "$@" > $O/$name.out 2> $O/$name.err; local rc=$?
  echo "$name rc=$rc wall=$(( $(date +%s)-s ))s: $*" | tee -a $OUT/times.txt; tail -1 $O/$name.out
  tail -5 $O/$name.err > $O/$name.errtail; rm -f $O/$name.err; }
date -u > $OUT/times.txt
G="--model=transformer --embed_dim=768 --num_layers=12 --num_heads=12 --seq_len=1024 --dtype=bfloat16 --attention=fused --eval_every=1000"
t profile_auto 200 python3 benchmarks/results/tpu/profile_step.py auto $O/prof -- $G --batch_size=16 --steps=30 --workdir=$R/prof
find $O/prof -name '*.xplane.pb' -delete; find $O/prof -size +12M -print -delete
t typed_b16 160 python3 -m typed.train $G --batch_size=16 --steps=60 --workdir=$R/typed16
t auto_b32 160 python3 -m auto.train $G --batch_size=32 --steps=60 --workdir=$R/auto32
date -u >> $OUT/times.txt
tar -czf $OUT/c1.tgz -C $O .
ls -la $OUT
