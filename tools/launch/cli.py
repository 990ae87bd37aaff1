"""Runs a train command as several local processes, the way a cluster would run one per host.

    python -m tools.launch --num_processes=2 --cpu_devices_per_process=4 -- \\
        python -m auto.train --model=mlp --steps=300 --workdir=runs/mp

Each process gets --coordinator_address (a free loopback port), --num_processes, --process_id
and --cpu_devices appended; JAX's own runtime (jax.distributed) does the rest, with gloo for the
CPU collectives. Process 0's output comes through, without gloo's `[Gloo] Rank 0 is connected`
lines and the launcher's own notes (each process's pid) unless --verbose; the others' goes to log
files in a temporary folder, and the end of a failed process's log is shown.

It never hangs on a process that exits or on a signal (and with --timeout, not on processes that
all hang either), and none of the processes it started outlives it (unless the launcher itself is
killed with SIGKILL). As soon as any process exits, successfully or not, the others get
--grace_seconds to exit too (a good run's processes finish together; after a failure the others
stop after --heartbeat_timeout); then the launcher kills each that is left, names it, and exits
non-zero: the processes' own status where every one that failed exited alike (each refused a
bad input: 2), else 1. If a process fails, the launcher says which and how. SIGINT, SIGTERM and
SIGHUP to the launcher are passed on to every process, which again get --grace_seconds before
they are killed; the launcher then exits 128 + the signal (130 for SIGINT, 143 for SIGTERM). A
second signal kills them at once. A program that cannot be started is named in one line (exit
127 if it does not exist, 126 otherwise); a bad launcher flag, or no `--` before the command,
too (exit 2).

The log folder is removed at the end, except when a process other than 0 failed: then it is
kept, and named, so that the whole of that process's log can be read. After a signal it is
removed: the run was stopped on purpose.
"""

import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from absl import flags

from shard_parity import refuse, runtime

from .net import free_port

NUM = flags.DEFINE_integer('num_processes', 2, 'How many processes.', lower_bound=1)
DEVICES = flags.DEFINE_integer(
    'cpu_devices_per_process', 4, 'CPU devices each process emulates.', lower_bound=1
)
GRACE = flags.DEFINE_integer(
    'grace_seconds',
    120,
    'Once a process has exited (or the launcher got a signal), how long the others get to exit '
    'by themselves before they are killed: after SIGTERM, enough to finish a compile, reach the '
    'step all processes stop at and save it.',
    lower_bound=0,
)
TIMEOUT = flags.DEFINE_integer(
    'timeout',
    None,
    'Stop the run after this many seconds in all, as if the launcher got SIGTERM (each process '
    'saves and exits; those left after --grace_seconds are killed), and exit 124: for when every '
    'process hangs, which nothing else notices.',
    lower_bound=1,
)
VERBOSE = flags.DEFINE_bool(
    'verbose', False, "Also show each process's pid and gloo's connection lines."
)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
received: list[int] = []  # the signals the launcher got, in order


def describe(code: int) -> str:
    return f'was killed by {signal.Signals(-code).name}' if code < 0 else f'exited with {code}'


open_line = [False]  # process 0's stderr ends mid-line (its progress bar): say() starts a new one


def say(message: str) -> None:
    print(('\n' if open_line[0] else '') + f'[launch] {message}', file=sys.stderr, flush=True)
    open_line[0] = False


def relay(stream, out, keep) -> None:
    """Copies a stream of process 0 to `out` (ours) as it comes; `keep(line)` says which whole
    lines pass (None: every byte passes at once, as a progress bar's carriage returns need)."""
    read = stream.readline if keep else (lambda: os.read(stream.fileno(), 1 << 16))
    for chunk in iter(read, b''):
        if keep and not keep(chunk):
            continue
        try:
            out.write(chunk)
            out.flush()
        except OSError:  # ours is gone (a closed pipe): keep draining theirs
            pass
        if not keep:
            open_line[0] = not chunk.endswith(b'\n')


def start_0(command: list[str]) -> tuple[subprocess.Popen, list[threading.Thread]]:
    """Process 0, its output relayed: without gloo's connection lines (printed by its C++ over
    the progress bar) and with JAX's C++ warnings (`W1202 ... SIGTERM caught`) off, unless
    --verbose; unbuffered (if Python), so that its lines come as they are printed."""
    env = {**os.environ, 'PYTHONUNBUFFERED': '1'}
    if not VERBOSE.value:
        env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    pipe = subprocess.PIPE
    proc = subprocess.Popen(command, stdout=pipe, stderr=pipe, env=env)
    keep = (lambda line: True) if VERBOSE.value else (lambda line: not line.startswith(b'[Gloo] '))
    threads = [
        threading.Thread(target=relay, args=(proc.stdout, sys.stdout.buffer, keep), daemon=True),
        threading.Thread(target=relay, args=(proc.stderr, sys.stderr.buffer, None), daemon=True),
    ]
    for t in threads:
        t.start()
    return proc, threads


def launch(command: list[str], n: int, devices: int, logs: pathlib.Path, procs: list) -> list:
    """Starts the n processes, appending each to `procs` as it starts (so that whoever called
    can end those already started if a later one cannot start). Returns the threads that relay
    process 0's output."""
    port, relayed = free_port(), []
    for i in range(n):
        extra = [
            f'--coordinator_address=127.0.0.1:{port}',
            f'--num_processes={n}',
            f'--process_id={i}',
            f'--cpu_devices={devices}',
        ]
        if i == 0:
            proc, relayed = start_0(command + extra)
            procs.append(proc)
        else:
            with open(logs / f'process_{i}.log', 'w') as out:  # the child keeps its own copy
                procs.append(subprocess.Popen(command + extra, stdout=out, stderr=out))
        if VERBOSE.value:
            say(f'process {i}: pid {procs[-1].pid}')
    return relayed


def kill_all(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def supervise(procs, logs: pathlib.Path, grace: int, timeout: int | None = None) -> int:
    """Waits for all. Once one has exited, or a signal came (or `timeout` seconds passed), ends
    the rest after `grace` seconds. Returns the launcher's exit status; removes the log folder
    unless a failed log is in it."""
    deadline, cause = None, None  # when the others get killed, and why
    reported, killed, forwarded = set(), set(), 0
    expires, expired = time.monotonic() + (timeout or math.inf), False
    while True:
        running = [i for i, p in enumerate(procs) if p.poll() is None]
        if not running:
            break
        now = time.monotonic()
        if now >= expires and not expired:
            expired = True
            say(f'error: --timeout={timeout} s passed; stopping the processes as at a SIGTERM')
            received.append(signal.SIGTERM)
        if len(received) > forwarded:
            name = signal.Signals(received[-1]).name
            if forwarded:
                say(f'got {name} again; killing the processes')
                kill_all(procs)
                break
            say(f'got {name}; passing it on, the processes get up to {grace} s to exit')
            for i in running:
                procs[i].send_signal(received[-1])
            forwarded = len(received)
            if deadline is None:
                deadline, cause = now + grace, name
        for i, p in enumerate(procs):
            if p.returncode is None or i in reported:
                continue
            reported.add(i)
            if deadline is None:
                deadline, cause = now + grace, f'process {i}'
            if p.returncode and not forwarded and any(q.returncode is None for q in procs):
                left = math.ceil(max(0.0, deadline - now))
                say(
                    f'error: process {i} {describe(p.returncode)}; waiting up to {left} s for the '
                    'others to stop'
                )
        if deadline is not None and now >= deadline:
            for i in running:
                if i not in killed:
                    say(f'error: process {i} did not exit within {grace} s of {cause}; killed it')
                    procs[i].kill()
                    killed.add(i)
        time.sleep(0.05)
    codes = [p.wait() for p in procs]
    if received:
        shutil.rmtree(logs, ignore_errors=True)
        return 124 if expired else 128 + received[0]
    for i, code in enumerate(codes):
        if code and i:
            log = logs / f'process_{i}.log'
            tail = log.read_bytes().decode(errors='replace').splitlines()[-5:]
            say(f'process {i} {describe(code)}; its log ({log}) ends:\n  ' + '\n  '.join(tail))
    bad = [i for i, c in enumerate(codes) if c]
    if any(bad_i > 0 for bad_i in bad):
        say(f'the logs stay in {logs}')
    else:
        shutil.rmtree(logs, ignore_errors=True)
    if bad:
        say(f'error: processes {bad} failed')
    return status_of([codes[i] for i in bad])


def status_of(failed: list[int]) -> int:
    """The launcher's exit status for the exit statuses of the processes that failed: theirs
    where they all exited alike (each refused a bad input: 2), so that it means what the
    command's would (docs/errors.md); else 1, a failure while running (killed, or mixed)."""
    if not failed:
        return 0
    return failed[0] if len(set(failed)) == 1 and failed[0] > 0 else 1


def on_signal(signum, frame):
    received.append(signum)  # supervise() passes it on: it may come before all have started


def main(argv):
    command = argv[1:]
    if not command:
        refuse(
            'no command after --: python -m tools.launch [--num_processes=N] '
            '[--cpu_devices_per_process=K] -- python -m auto.train ...'
        )
    for s in FORWARDED:
        signal.signal(s, on_signal)
    logs = pathlib.Path(tempfile.mkdtemp(prefix='shard-parity-launch-'))
    procs, code, relayed = [], None, []
    try:
        try:
            relayed = launch(command, NUM.value, DEVICES.value, logs, procs)
        except OSError as e:
            say(f'error: cannot run {command[0]}: {e.strerror}')
            kill_all(procs)
            shutil.rmtree(logs, ignore_errors=True)
            code = 127 if isinstance(e, FileNotFoundError) else 126
        else:
            code = supervise(procs, logs, GRACE.value, TIMEOUT.value)
    finally:
        kill_all(procs)  # only if the launcher itself failed is any left
        for thread in relayed:  # the last lines; not forever: a grandchild may hold the pipe
            thread.join(timeout=5)
        if code is None:
            shutil.rmtree(logs, ignore_errors=True)
    sys.exit(code)


def parse_flags(argv):
    """The launcher's flags, before `--`; forgetting the `--` is one line saying so; a flag
    absl refuses is one line too, exit 2, as in every CLI (shard_parity.runtime.parse_flags)."""
    helping = any(a.split('=')[0] in ('--help', '--helpshort', '--helpfull') for a in argv[1:])
    if '--' not in argv[1:] and not helping:
        refuse(
            'put -- before the command: python -m tools.launch [--num_processes=N] '
            f'-- {" ".join(argv[1:]) or "python -m auto.train ..."}'
        )
    return runtime.parse_flags(argv)
