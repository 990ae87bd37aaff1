# Sourced by benchmarks/gpu.sh and tpu.sh (they set $log and the array `failed` first).
# step SECONDS COMMAND...: run it under a time limit, log it, remember a failure by its program,
# or by its module for `python -m`.
step() {
  local limit=$1
  shift
  echo "== $* (limit ${limit}s)" | tee -a "$log"
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  local status=${PIPESTATUS[0]}
  echo "== exit $status after $((SECONDS - start)) s" | tee -a "$log"
  local name=$1
  [ "${2:-}" = -m ] && name=$3
  [ "$status" = 0 ] || failed+=("$name")
}
