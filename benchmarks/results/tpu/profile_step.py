"""Profiles a twin's train step on the chip: runs the train CLI as given, traces steps
START..START+STEPS-1 with jax.profiler (a Perfetto trace), and prints the device time by XLA op
and by category of op (the top ops name where the time goes). The categories come from the
compiled step's HLO (OUT/hlo_TWIN.txt.gz): a fusion that calls a convolution or dot is a
matmul, a copy or transpose (alone or as a fusion's root) is layout, a Pallas custom call is
the attention kernel. OUT/ops_TWIN.json holds every op's time a step and its category, and
OUT/trace_TWIN.json.gz the device's XLA ops of one traced step (Perfetto opens it).
SPLASH_FUSED=1 and SPLASH_BLOCK=N in the environment set shard_parity.model.splash's
FUSED_BACKWARD and BLOCK (levers).

    python3 benchmarks/results/tpu/profile_step.py auto OUT_DIR -- --model=transformer ...

The step function is wrapped before the twin is imported (every twin's train_step comes from
shard_parity.step.make_train_step), so the run is the CLI's own, flags and all.
"""

import collections
import glob
import gzip
import importlib
import json
import os
import re
import sys

import jax
from hlo_ops import categories  # beside this script

import shard_parity.model.splash as splash_module
import shard_parity.step as step_module

splash_module.FUSED_BACKWARD = os.environ.get('SPLASH_FUSED') == '1'
splash_module.BLOCK = int(os.environ.get('SPLASH_BLOCK', splash_module.BLOCK))
HLO = {}  # the compiled step's text
TWIN, OUT = sys.argv[1], sys.argv[2]
ARGS = sys.argv[sys.argv.index('--') + 1:]
START, STEPS = 20, 5
TRACE = os.path.join(OUT, f'trace_{TWIN}')

original = step_module.make_train_step


def traced(*args, **kwargs):
    fn = original(*args, **kwargs)
    calls = [0]

    def wrapped(state, batch):
        calls[0] += 1
        if calls[0] == START:
            jax.block_until_ready(state)
            try:  # the same executable (jax's compilation cache), for the ops' categories
                HLO['text'] = fn.lower(state, batch).compile().as_text()
            except Exception as e:  # noqa: BLE001 - a profile without categories still helps
                print('no HLO text:', e)
            jax.profiler.start_trace(TRACE, create_perfetto_trace=True)
        out = fn(state, batch)
        if calls[0] == START + STEPS - 1:
            jax.block_until_ready(out)
            jax.profiler.stop_trace()
        return out

    return wrapped


step_module.make_train_step = traced

def summarize():
    paths = glob.glob(os.path.join(TRACE, '**', 'perfetto_trace.json.gz'), recursive=True)
    paths += glob.glob(os.path.join(TRACE, '**', '*.trace.json.gz'), recursive=True)
    if not paths:
        print('no trace file found under', TRACE)
        return
    with gzip.open(paths[0]) as f:
        trace = json.load(f)
    events = trace['traceEvents'] if isinstance(trace, dict) else trace
    names = {}  # (pid, tid) -> thread name; pid -> process name
    for e in events:
        if e.get('ph') == 'M' and e.get('name') in ('process_name', 'thread_name'):
            key = e['pid'] if e['name'] == 'process_name' else (e['pid'], e.get('tid'))
            names[key] = e.get('args', {}).get('name', '')
    device_pids = {p for p, n in names.items() if isinstance(p, int) and re.search(r'TPU|/device', n)}
    ops, total, kept = collections.Counter(), 0.0, []
    for e in events:
        if e.get('ph') != 'X' or e.get('pid') not in device_pids:
            continue
        if 'XLA Ops' not in names.get((e['pid'], e.get('tid')), ''):
            continue
        ops[e['name']] += e.get('dur', 0)
        total += e.get('dur', 0)
        kept.append(e)
    first = min((e['ts'] for e in kept), default=0)
    one = [e for e in kept if e['ts'] - first < total / STEPS]  # about the first traced step
    meta = [e for e in events if e.get('ph') == 'M' and e.get('pid') in device_pids]
    with gzip.open(os.path.join(OUT, f'trace_{TWIN}.json.gz'), 'wt') as f:
        json.dump({'traceEvents': meta + one}, f)
    text = HLO.get('text', '')
    if text:
        with gzip.open(os.path.join(OUT, f'hlo_{TWIN}.txt.gz'), 'wt') as f:
            f.write(text)
    cat_of = categories(text) if text else {}
    print(f'XLA ops over {STEPS} steps: {total / 1e3:.1f} ms, {total / STEPS / 1e3:.2f} ms a step')
    cats = collections.Counter()
    for name, dur in ops.items():
        cats[cat_of.get(name, 'unknown')] += dur
    for cat, dur in cats.most_common():
        print(f'  {cat:28s} {dur / STEPS / 1e3:8.2f} ms a step  {100 * dur / max(total, 1):5.1f}%')
    table = [{'op': n, 'ms_per_step': d / STEPS / 1e3, 'category': cat_of.get(n, 'unknown')}
             for n, d in ops.most_common()]  # fmt: skip
    with open(os.path.join(OUT, f'ops_{TWIN}.json'), 'w') as f:
        json.dump({'ms_per_step': total / STEPS / 1e3, 'categories': {c: d / STEPS / 1e3 for c, d in cats.items()},
                   'ops': table}, f, indent=0)  # fmt: skip
    print('top 30 ops:')
    for row in table[:30]:
        print(f"  {row['ms_per_step']:8.3f} ms  {row['category']:26s} {row['op']}")


if __name__ == '__main__':
    twin = importlib.import_module(TWIN)
    from absl import app

    from shard_parity.runtime import parse_flags
    from shard_parity.runtime.train import main

    sys.argv = [f'{TWIN}.train', *ARGS]
    try:
        app.run(main(twin), flags_parser=parse_flags)
    except SystemExit as e:
        print('train exited', e.code)
    summarize()
