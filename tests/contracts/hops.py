"""A loopback HTTP server that records the credential headers of every request it gets and
answers with a redirect or a small JSON body: two of them on different ports are two origins, so a
client that follows a redirect from one to the other can be caught handing over its credentials."""

from __future__ import annotations

import http.server
import ipaddress
import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CREDENTIALS = ("Authorization", "Proxy-Authorization", "Cookie", "auth-token")


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    credentials: dict[str, str]  # the credential headers that arrived (CREDENTIALS), by name


class Hop:
    """``redirect(path)`` → the URL to send the client to (``code``), or None to answer ``body`` (200)."""

    def __init__(
        self, redirect: Callable[[str], str | None] = lambda path: None, *, code: int = 302, body: Any = None
    ) -> None:
        self.redirect = redirect
        self.code = code
        self.body = {} if body is None else body
        self.seen: list[Seen] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return

            def handle_one(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                found = {name: self.headers[name] for name in CREDENTIALS if self.headers.get(name) is not None}
                outer.seen.append(Seen(self.command, self.path, found))
                target = outer.redirect(self.path)
                if target is not None:
                    self.send_response(outer.code)
                    self.send_header("Location", target)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = json.dumps(outer.body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = handle_one

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> Hop:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def to(hop: Hop) -> Callable[[str], str]:
    """Redirect every request to the same path on ``hop``."""
    return lambda path: hop.url + path


def non_loopback_address() -> str | None:
    """An IPv4 address of this host that is not loopback (the one its default route leaves from;
    no packet is sent), or None on a host with no such interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: connect() on UDP only picks the route
            address = str(s.getsockname()[0])
        except OSError:
            return None
    if ipaddress.ip_address(address).is_loopback or address == "0.0.0.0":
        return None
    try:
        with socket.create_server((address, 0)):
            return address
    except OSError:
        return None
