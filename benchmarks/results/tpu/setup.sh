#!/bin/bash
# Sourced by every script run on the TPU v5e host (from the repository's root, the data copied
# to runs/data): installs what the chip host lacks from its own package index into /tmp/site
# (once per machine), and points Python and the project at the checkout and the data.
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/flax ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: \
    --index-url file:///opt/pypi/simple --target /tmp/site \
    flax optax orbax-checkpoint absl-py tqdm hypothesis pytest > /tmp/pip.txt 2>&1
fi
export PYTHONPATH=${PYTHONPATH:-}:/tmp/site:$PWD
export SHARD_PARITY_DATA_DIR=$PWD/runs/data
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
