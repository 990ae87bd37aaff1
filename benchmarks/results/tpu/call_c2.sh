#!/bin/bash
# Session 11, third chip call: the inspector on the chip (item 5: inspector.sh's three
# configurations, --measure_memory) and short runs saved at every step with this commit's
# config.json (platform and device kind recorded), for the recorded-side bisect on the CPU
# (item 6). Each run is one tarball under 16 MB: steps 0 and 1 only.
source benchmarks/results/tpu/setup.sh
R=/tmp/rc2; rm -rf $R; mkdir -p $R
date -u > $OUT/times.txt
I=/tmp/oi; rm -rf $I; mkdir -p $I
OUT=$I bash benchmarks/results/tpu/inspector.sh; tar -czf $OUT/inspector.tgz -C $I .
S="--steps=1 --checkpoint_every=1 --save_initial --keep=10 --log_every=1 --eval_every=1000"
run() { local name=$1; shift; local s=$(date +%s)
  timeout 150 "$@" $S --workdir=$R/$name > $R/$name.out 2> $R/$name.err
  echo "$name rc=$? wall=$(( $(date +%s)-s ))s: $*" | tee -a $OUT/times.txt
  tail -3 $R/$name.err > $R/$name/stderr_tail.txt; tar -czf $OUT/$name.tgz -C $R $name; }
run chip_mlp python3 -m explicit.train --model=mlp
run chip_tr_bf16 python3 -m auto.train --model=transformer --dtype=bfloat16
run chip_tr_f32 python3 -m auto.train --model=transformer
date -u >> $OUT/times.txt
ls -la $OUT
