#!/bin/bash
# Runs chip scripts one after another in one call, each with its own OUT folder, and packs each
# folder into one tarball under the call's $OUT (a call brings back at most 8 files):
#   bash benchmarks/results/tpu/batch.sh remat inspector      # -> $OUT/remat.tgz, $OUT/inspector.tgz
# Environment variables given before it reach every script (e.g. STEPS=20 for remat.sh).
FINAL=${OUT:?run on the chip host, where OUT is set}
for name in "$@"; do
  dir=/tmp/out_$name; rm -rf "$dir"; mkdir -p "$dir"
  start=$(date +%s)
  OUT=$dir bash benchmarks/results/tpu/$name.sh > "$dir/$name.stdout" 2>&1
  echo "$name rc=$? wall=$(( $(date +%s) - start ))s" | tee -a "$FINAL/batch.txt"
  tail -25 "$dir/$name.stdout"
  find "$dir" -size +12M -print -delete
  tar -czf "$FINAL/$name.tgz" -C "$dir" .
done
