"""Networking shared by the parts: loopback ports for the parts that start local servers (the
extender's demo, the simulator's spawned extenders, the tests and benchmarks), and a deadline
for a whole HTTP exchange (the carbon-intensity clients, the agent's Redfish client).

A socket's timeout bounds each read and restarts with every byte, so a server that trickles its
answer holds the caller for as long as it likes. At the deadline :class:`Deadline` shuts the
connection's socket down, which wakes the read blocked on it (closing it alone does not on
Linux); ``expired`` then says why the exchange failed.
"""

from __future__ import annotations

import http.client
import socket
import threading
from types import TracebackType


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Deadline:
    """``with Deadline(conn, seconds) as d:`` around one exchange on ``conn``; ``d.expired`` after."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self.conn = conn
        self._expired = threading.Event()
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True

    @property
    def expired(self) -> bool:
        return self._expired.is_set()

    def _cut(self) -> None:
        self._expired.set()
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._timer.cancel()
