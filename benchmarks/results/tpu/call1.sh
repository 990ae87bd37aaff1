#!/bin/bash
# Call 1 on the TPU v5e host: environment, determinism, chip vs CPU, suspect tests at HEAD.
set -u
O=/tmp/o; mkdir -p $O; R=/tmp/r
cd runs/head
export PYTHONUNBUFFERED=1
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: --index-url file:///opt/pypi/simple --target /tmp/site flax optax orbax-checkpoint absl-py tqdm hypothesis pytest > $O/pip.txt 2>&1
export PYTHONPATH=$PYTHONPATH:/tmp/site:$PWD
export SHARD_PARITY_DATA_DIR=$PWD/../data
{ date -u; python3 -c "import jax, jaxlib, sys; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, sys.version.split()[0]); d=jax.devices()[0]; print(d.platform, d.device_kind, len(jax.devices()))";
  python3 -m pip list 2>/dev/null | grep -i -E "^(jax|jaxlib|libtpu|libtpu-nightly|flax|optax|orbax-checkpoint|numpy|pytest) "; nproc; } > $O/env.txt 2>&1
cat $O/env.txt
run() { local name=$1; shift; local t=$(date +%s); "$@" > $O/$name.out 2> $O/$name.err; local rc=$?; echo "$name rc=$rc $(( $(date +%s)-t ))s" | tee -a $O/times.txt; tail -1 $O/$name.out; }
# 1. MLP twice on the chip, once on this host's CPU (one CPU device)
run mlp_tpu_a python3 -m auto.train --model=mlp --steps=600 --workdir=$R/mlp_tpu_a
run mlp_tpu_b python3 -m auto.train --model=mlp --steps=600 --workdir=$R/mlp_tpu_b
run mlp_cpu env JAX_PLATFORMS=cpu python3 -m auto.train --model=mlp --steps=600 --cpu_devices=1 --workdir=$R/mlp_cpu
# 2. the transformer, default config in bf16, twice in auto and twice in typed; once on the CPU
for n in a b; do
  run tr_auto_$n python3 -m auto.train --model=transformer --dtype=bfloat16 --steps=600 --workdir=$R/tr_auto_$n
  run tr_typed_$n python3 -m typed.train --model=transformer --dtype=bfloat16 --steps=600 --workdir=$R/tr_typed_$n
done
run tr_cpu env JAX_PLATFORMS=cpu timeout 100 python3 -m auto.train --model=transformer --dtype=bfloat16 --steps=600 --cpu_devices=1 --workdir=$R/tr_cpu
# 3. bitwise? every metrics line without the throughput; and the saved params' bytes
python3 - > $O/bitwise.txt 2>&1 <<'PY'
import json, pathlib, hashlib
R = pathlib.Path('/tmp/r')
def lines(w):
    return [{k: v for k, v in json.loads(x).items() if not k.endswith('_per_sec')}
            for x in (R / w / 'metrics.jsonl').read_text().splitlines()]
for a, b in [('mlp_tpu_a', 'mlp_tpu_b'), ('tr_auto_a', 'tr_auto_b'), ('tr_typed_a', 'tr_typed_b'),
             ('tr_auto_a', 'tr_typed_a'), ('mlp_tpu_a', 'mlp_cpu'), ('tr_auto_a', 'tr_cpu')]:
    try:
        la, lb = lines(a), lines(b)
        diff = [(x, y) for x, y in zip(la, lb) if x != y]
        print(f'{a} vs {b}: metrics lines {len(la)}/{len(lb)}, bitwise equal: {la == lb}; first differing: {diff[:1]}')
        print('   final', la[-1], '\n   final', lb[-1])
    except Exception as e:
        print(a, b, 'error', e)
PY
cat $O/bitwise.txt
for p in "mlp_tpu_a mlp_tpu_b" "mlp_tpu_a mlp_cpu" "tr_auto_a tr_auto_b" "tr_auto_a tr_typed_a" "tr_auto_a tr_cpu"; do
  set -- $p; echo "== compare $1 $2" >> $O/compare.txt
  python3 -m tools.compare $R/$1 $R/$2 >> $O/compare.txt 2>&1; echo "rc=$?" >> $O/compare.txt
done
tail -n 40 $O/compare.txt
for w in mlp_tpu_a mlp_cpu tr_auto_a tr_auto_b tr_typed_a tr_cpu; do cp $R/$w/metrics.jsonl $O/$w.metrics.jsonl 2>/dev/null; cp $R/$w/config.json $O/$w.config.json 2>/dev/null; done
# 4. the suspect tests at HEAD (fast tier), to see how they fail here
timeout 170 python3 -m pytest -m "not slow" -v -p no:cacheprovider -rfEs --tb=short parity_tests/test_compare.py parity_tests/test_fuzz.py parity_tests/test_launch.py parity_tests/test_datasets.py parity_tests/test_multiprocess.py > $O/tests_head.txt 2>&1
tail -n 60 $O/tests_head.txt
tar -czf $OUT/call1.tgz -C $O .
