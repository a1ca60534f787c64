"""Loopback networking shared by the parts that start local servers (the extender's demo, the
simulator's spawned extenders) and by the tests and benchmarks."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
