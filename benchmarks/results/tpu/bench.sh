#!/bin/bash
# The chip protocol's run of benchmarks/tpu.sh (issue 53, item 4), lighter to fit 7 minutes: 50
# timed steps per twin for the GPT-2-small row instead of 60, and each of its two benchmark
# processes limited to 190 s (tpu.sh's own: 300). Results: $OUT/results_tpu.{json,md},
# $OUT/tpu.log; the start, the status and the end in $OUT/date.txt.
source benchmarks/results/tpu/setup.sh
date -u > "$OUT/date.txt"
TPU_LIMIT_A=190 TPU_LIMIT_B=190 bash benchmarks/tpu.sh "$OUT" --mfu_steps=50
echo "exit $?" >> "$OUT/date.txt"; date -u >> "$OUT/date.txt"
