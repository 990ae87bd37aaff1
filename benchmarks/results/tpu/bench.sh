#!/bin/bash
# The chip protocol's run of benchmarks/tpu.sh (issue 53, item 4), lighter to fit 7 minutes: the
# default sections, 50 timed steps per twin for the GPT-2-small row instead of 60. Results:
# $OUT/results_tpu.{json,md} and $OUT/tpu.log.
source benchmarks/results/tpu/setup.sh
date -u > "$OUT/date.txt"
timeout 400 bash benchmarks/tpu.sh "$OUT" --mfu_steps=50
echo "exit $?" >> "$OUT/date.txt"; date -u >> "$OUT/date.txt"
