"""Runs a train command as several local processes, the way a cluster would run one per host.

    python -m parity_tests.launch --num_processes=2 --cpu_devices_per_process=4 -- \\
        python -m auto.train --model=mlp --steps=300 --workdir=runs/mp

Each process gets --coordinator_address (a free loopback port), --num_processes, --process_id
and --cpu_devices appended; JAX's own runtime (jax.distributed) does the rest, with gloo for the
CPU collectives. Process 0's output comes through; the others' goes to log files, shown if they
fail. If any process dies, the launcher says which and how, waits --grace_seconds for the others
to notice (they stop after --heartbeat_timeout), then ends them: it never hangs.
"""

import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

from absl import app, flags

NUM = flags.DEFINE_integer('num_processes', 2, 'How many processes.', lower_bound=1)
DEVICES = flags.DEFINE_integer(
    'cpu_devices_per_process', 4, 'CPU devices each process emulates.', lower_bound=1
)
GRACE = flags.DEFINE_integer(
    'grace_seconds',
    45,
    'After a process dies, how long the others get to stop by themselves before they are ended.',
    lower_bound=0,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def describe(code: int) -> str:
    return f'was killed by {signal.Signals(-code).name}' if code < 0 else f'exited with {code}'


def launch(command: list[str], n: int, devices: int, logs: pathlib.Path) -> list:
    port = free_port()
    procs = []
    for i in range(n):
        extra = [
            f'--coordinator_address=127.0.0.1:{port}',
            f'--num_processes={n}',
            f'--process_id={i}',
            f'--cpu_devices={devices}',
        ]
        out = None if i == 0 else open(logs / f'process_{i}.log', 'w')
        procs.append(subprocess.Popen(command + extra, stdout=out, stderr=out))
        print(f'[launch] process {i}: pid {procs[-1].pid}', file=sys.stderr, flush=True)
    return procs


def supervise(procs, logs: pathlib.Path, grace: int) -> int:
    """Waits for all; if one fails, reports it and ends the rest after `grace` seconds."""
    failed_at = None
    while any(p.poll() is None for p in procs):
        failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode not in (None, 0)]
        if failed and failed_at is None:
            failed_at = time.time()
            for i, code in failed:
                print(
                    f'[launch] error: process {i} {describe(code)}; waiting up to {grace} s '
                    'for the others to stop',
                    file=sys.stderr,
                    flush=True,
                )
        if failed_at is not None and time.time() - failed_at > grace:
            for i, p in enumerate(procs):
                if p.poll() is None:
                    print(f'[launch] ending process {i}', file=sys.stderr, flush=True)
                    p.kill()
        time.sleep(0.2)
    codes = [p.wait() for p in procs]
    for i, code in enumerate(codes):
        if code and i:
            tail = (logs / f'process_{i}.log').read_text().splitlines()[-5:]
            print(
                f'[launch] process {i} {describe(code)}; its log ({logs}/process_{i}.log) '
                'ends:\n  ' + '\n  '.join(tail),
                file=sys.stderr,
            )
    bad = [i for i, c in enumerate(codes) if c]
    if bad:
        print(f'[launch] error: processes {bad} failed', file=sys.stderr)
    return 1 if bad else 0


def main(argv):
    command = argv[1:]
    if not command:
        sys.exit(
            'usage: python -m parity_tests.launch [--num_processes=N] '
            '[--cpu_devices_per_process=K] -- python -m auto.train ...'
        )
    logs = pathlib.Path(tempfile.mkdtemp(prefix='shard-parity-launch-'))
    sys.exit(supervise(launch(command, NUM.value, DEVICES.value, logs), logs, GRACE.value))


if __name__ == '__main__':
    app.run(main)
