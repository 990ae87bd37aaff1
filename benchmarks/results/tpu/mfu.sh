#!/bin/bash
# MFU on the chip: the GPT-2-small shape (~100 steps) in the three twins, the nanoGPT default in
# bf16; the final lines to $OUT/mfu.txt, each run's stderr tail and metrics in $OUT/mfu.tgz.
set -u
O=/tmp/m; mkdir -p $O; R=/tmp/mr
cd runs/after
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/flax ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: --index-url file:///opt/pypi/simple --target /tmp/site flax optax orbax-checkpoint absl-py tqdm hypothesis pytest > /tmp/pip.txt 2>&1
fi
export PYTHONPATH=$PYTHONPATH:/tmp/site:$PWD
export SHARD_PARITY_DATA_DIR=$PWD/../data
G="--model=transformer --embed_dim=768 --num_layers=12 --num_heads=12 --seq_len=1024 --batch_size=16 --dtype=bfloat16 --steps=100 --attention=fused"
run() { local name=$1; shift; local t=$(date +%s);
  timeout 170 "$@" > $O/$name.out 2> $O/$name.err; local rc=$?
  echo "$name rc=$rc wall=$(( $(date +%s)-t ))s: $*" | tee -a $OUT/mfu.txt; tail -1 $O/$name.out | tee -a $OUT/mfu.txt; }
date -u | tee $OUT/mfu.txt
run nanogpt_auto python3 -m auto.train --model=transformer --dtype=bfloat16 --steps=600 --workdir=$R/nanogpt_auto
run gpt2_auto python3 -m auto.train $G --workdir=$R/gpt2_auto
run gpt2_explicit python3 -m explicit.train $G --workdir=$R/gpt2_explicit
run gpt2_typed python3 -m typed.train $G --workdir=$R/gpt2_typed
for w in $R/*; do cp $w/metrics.jsonl $O/$(basename $w).metrics.jsonl; done
tar -czf $OUT/mfu.tgz -C $O .
