"""Loopback ports for local multi-process runs: no flags, no JAX, so the launcher and the tests
can both import it (importing launch.py itself would define its absl flags a second time)."""

import socket


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now: for a local coordinator."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]
