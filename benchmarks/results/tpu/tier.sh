#!/bin/bash
# The fast tier on the TPU host, half $1 (A: the first 28 test files, B: the rest), from the
# committed snapshot in runs/after. Writes $OUT/tier_$1.txt.
set -u
cd runs/after
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/flax ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: --index-url file:///opt/pypi/simple --target /tmp/site flax optax orbax-checkpoint absl-py tqdm hypothesis pytest > /tmp/pip.txt 2>&1
fi
export PYTHONPATH=$PYTHONPATH:/tmp/site:$PWD
export SHARD_PARITY_DATA_DIR=$PWD/../data
FILES=$(ls parity_tests/test_*.py)
if [ "$1" = A ]; then FILES=$(echo "$FILES" | head -28); else FILES=$(echo "$FILES" | tail -n +29); fi
date -u
START=$(date +%s)
timeout ${2:-540} python3 -m pytest -m "not slow" -q -p no:cacheprovider -rfEs --durations=8 $FILES 2>&1 | tee $OUT/tier_$1.txt | grep -v "^\.\+\s*\[" | tail -n 80
echo "half $1: $(( $(date +%s) - START )) s" | tee -a $OUT/tier_$1.txt
