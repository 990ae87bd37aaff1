"""Joining JAX's multi-process runtime (jax.distributed) before anything else touches JAX, where
Ctrl-C and SIGTERM still work: the train CLI's first step with --coordinator_address,
--num_processes and --process_id (or --distributed_auto), as tools/launch/cli.py passes them."""

import os
import signal
import socket
import sys
import threading
import time

import jax

from shard_parity import UsageError
from shard_parity.runtime.loop import SIGNALS


def start_processes(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    auto_detect: bool = False,
    heartbeat_timeout: int = 30,
) -> None:
    """Joins JAX's multi-process runtime, before anything else touches JAX. One process (no
    settings) skips it. On the CPU, cross-process collectives go through gloo."""
    if not (coordinator or num_processes or auto_detect):
        return
    if not auto_detect and None in (coordinator, num_processes, process_id):
        raise UsageError(
            'multi-process needs --coordinator_address, --num_processes and --process_id '
            '(or --distributed_auto on a cluster JAX can detect, such as SLURM)'
        )
    if not auto_detect and not 0 <= process_id < num_processes:
        raise UsageError(f'--process_id={process_id} must be in 0..{num_processes - 1}')
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')  # ignored off the CPU
    if coordinator and process_id:
        wait_for_coordinator(coordinator, heartbeat_timeout)
    join(coordinator, num_processes, process_id, heartbeat_timeout)


def wait_for_coordinator(address: str, seconds: int) -> None:
    """Process 0 serves the coordinator; the others knock for up to `seconds` first, in Python
    where Ctrl-C works, so that an address nobody answers is named at once (JAX itself waits
    5 minutes in silence, deaf to Ctrl-C)."""
    host, _, port = address.rpartition(':')
    deadline, note = time.monotonic() + seconds, time.monotonic() + 5
    while True:
        try:
            socket.create_connection((host.strip('[]'), int(port)), timeout=1).close()
            return
        except (OSError, ValueError) as e:
            if SIGNALS:
                raise KeyboardInterrupt from None
            if time.monotonic() > note and time.monotonic() < deadline:
                note = float('inf')
                print(
                    f'waiting for process 0 to answer at --coordinator_address={address} '
                    f'(up to {seconds} s, --heartbeat_timeout; Ctrl-C stops)',
                    file=sys.stderr,
                    flush=True,
                )
            if time.monotonic() > deadline or isinstance(e, ValueError):
                raise UsageError(
                    f'--coordinator_address={address}: nobody answered within {seconds} s '
                    '(--heartbeat_timeout): start process 0 first, or check the host and port'
                ) from None
            time.sleep(0.5)


def join(coordinator, num_processes, process_id, heartbeat_timeout: int) -> None:
    """jax.distributed.initialize, which blocks in C++ until every process has joined (JAX gives
    up after 5 minutes), deaf to Ctrl-C. A thread runs it while this one waits where signals are
    seen: after 5 s it says what it waits for, and Ctrl-C or SIGTERM end the process at once
    (nothing has started). SIGTERM keeps the train CLI's handler, which JAX's notifier replaces
    once joined; SIGINT is caught here meanwhile."""
    failed, got = [], []

    def initialize():
        try:
            jax.distributed.initialize(
                coordinator, num_processes, process_id, heartbeat_timeout_seconds=heartbeat_timeout
            )
        except Exception as e:  # raised again below, in the main thread
            failed.append(e)

    before = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    thread = threading.Thread(target=initialize, daemon=True)
    thread.start()
    note = time.monotonic() + 5
    while thread.is_alive():
        thread.join(0.1)
        if got or SIGNALS:  # exit without Python's shutdown, which would wait on JAX's client
            os.write(2, b'interrupted while the processes were joining: nothing was started\n')
            os._exit(128 + (got + SIGNALS)[0])
        if time.monotonic() > note:
            note = float('inf')
            where = coordinator or 'the coordinator JAX detected'
            print(
                f'waiting for all {num_processes or "the"} processes to join at {where} '
                '(JAX gives up after 5 minutes; Ctrl-C stops)',
                file=sys.stderr,
                flush=True,
            )
    signal.signal(signal.SIGINT, before)
    if failed:
        first = str(failed[0]).strip().split('\n')[0][:300]
        raise UsageError(
            f'--coordinator_address={coordinator}: the processes did not all join ({first})'
        ) from failed[0]
