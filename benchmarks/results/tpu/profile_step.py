"""Profiles a twin's train step on the chip: runs the train CLI as given, traces steps
START..START+STEPS-1 with jax.profiler (a Perfetto trace), and prints the device time by XLA op
and by category of op (the top ops name where the time goes).

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

import shard_parity.step as step_module

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
            jax.profiler.start_trace(TRACE, create_perfetto_trace=True)
        out = fn(state, batch)
        if calls[0] == START + STEPS - 1:
            jax.block_until_ready(out)
            jax.profiler.stop_trace()
        return out

    return wrapped


step_module.make_train_step = traced

CATEGORIES = [  # first match wins, on the op's name (lower case)
    ('attention kernel', r'splash|flash|custom-call|mha'),
    ('convolution/dot (MXU)', r'convolution|dot|fusion.*conv'),
    ('all-reduce/gather', r'all-reduce|all-gather|reduce-scatter|collective'),
    ('copy/transpose', r'copy|transpose'),
    ('reduce', r'reduce'),
    ('loop/while', r'while|scan|body|cond'),
    ('fusion (elementwise)', r'fusion'),
]


def summarize():
    paths = glob.glob(os.path.join(TRACE, '**', '*.trace.json.gz'), recursive=True)
    paths += glob.glob(os.path.join(TRACE, '**', 'perfetto_trace.json.gz'), recursive=True)
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
    ops, total = collections.Counter(), 0.0
    threads = collections.Counter()
    for e in events:
        if e.get('ph') != 'X' or e.get('pid') not in device_pids:
            continue
        thread = names.get((e['pid'], e.get('tid')), '')
        threads[thread] += e.get('dur', 0)
        if 'XLA Ops' not in thread:
            continue
        ops[e['name']] += e.get('dur', 0)
        total += e.get('dur', 0)
    print('device threads (us):', dict(threads.most_common(8)))
    print(f'XLA ops over {STEPS} steps: {total / 1e3:.1f} ms, {total / STEPS / 1e3:.2f} ms a step')
    cats = collections.Counter()
    for name, dur in ops.items():
        low = name.lower()
        cat = next((c for c, pat in CATEGORIES if re.search(pat, low)), 'other')
        cats[cat] += dur
    for cat, dur in cats.most_common():
        print(f'  {cat:24s} {dur / STEPS / 1e3:8.2f} ms a step  {100 * dur / max(total, 1):5.1f}%')
    print('top 25 ops:')
    for name, dur in ops.most_common(25):
        print(f'  {dur / STEPS / 1e3:8.3f} ms  {100 * dur / max(total, 1):5.1f}%  {name}')


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
