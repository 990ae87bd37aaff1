#!/bin/bash
# The first chip call of session 9: a profile of the GPT-2-small step (where the time goes),
# and the runs that item 6 judges against the CPU (full runs with their configs; a few steps
# saved at every step for the bisector), at matmul precision default and highest.
source benchmarks/results/tpu/setup.sh
R=/tmp/ra; mkdir -p $R
t() { local name=$1; shift; local s=$(date +%s);
  timeout 200 "$@" > $OUT/$name.out 2> $OUT/$name.err; local rc=$?
  echo "$name rc=$rc wall=$(( $(date +%s)-s ))s: $*" | tee -a $OUT/times.txt; tail -1 $OUT/$name.out; }
date -u > $OUT/times.txt
G="--model=transformer --embed_dim=768 --num_layers=12 --num_heads=12 --seq_len=1024 --batch_size=16 --dtype=bfloat16 --attention=fused"
t profile_gpt2_auto python3 benchmarks/results/tpu/profile_step.py auto $OUT/prof -- $G --steps=30 --eval_every=1000 --workdir=$R/prof_gpt2
find $OUT/prof -name 'vm.trace.json.gz' -delete
# item 6: full runs on the chip with their config.json (compare against CPU runs of the same)
t mlp_chip python3 -m auto.train --model=mlp --steps=600 --workdir=$R/mlp_chip
t mlp_chip_highest python3 -m auto.train --model=mlp --steps=600 --matmul_precision=highest --workdir=$R/mlp_chip_highest
t tr_auto_chip python3 -m auto.train --model=transformer --dtype=bfloat16 --steps=600 --workdir=$R/tr_auto_chip
t tr_typed_chip python3 -m typed.train --model=transformer --dtype=bfloat16 --steps=600 --workdir=$R/tr_typed_chip
# a few steps saved at every step: the chip's recorded transitions, for the bisector on the CPU
for p in default highest; do
  t mlp_steps_$p python3 -m auto.train --model=mlp --steps=3 --checkpoint_every=1 --keep=10 --save_initial --eval_every=1000 --matmul_precision=$p --workdir=$R/mlp_steps_$p
  t tr_steps_$p python3 -m auto.train --model=transformer --steps=3 --checkpoint_every=1 --keep=10 --save_initial --eval_every=1000 --matmul_precision=$p --workdir=$R/tr_steps_$p
done
t tr_steps_bf16 python3 -m auto.train --model=transformer --dtype=bfloat16 --steps=3 --checkpoint_every=1 --keep=10 --save_initial --eval_every=1000 --workdir=$R/tr_steps_bf16
tar -czf $OUT/runs.tgz -C $R --exclude=prof_gpt2 .
ls -la $OUT
