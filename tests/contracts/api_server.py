"""A local HTTP server that replays carbon-intensity API answers (recorded shapes, tests/contracts/carbon_apis/).

Routes are regular expressions over the request path (the query is recorded apart); each answers
a :class:`Reply`: a status and body, optionally sent one byte at a time (a server that trickles)
or never sent (a server that hangs). Every request is recorded with its query and headers.
"""

from __future__ import annotations

import http.server
import re
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "carbon_apis"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    mode: str = "normal"  # normal | trickle (one byte per 50 ms, status line included) | hang
    delay_s: float = 0.0
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)  # more header lines (Retry-After)


@dataclass
class Request:
    path: str
    query: dict[str, str]
    headers: dict[str, str]


@dataclass
class ApiServer:
    routes: dict[str, Reply | Callable[[Request], Reply]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    host: str = "127.0.0.1"  # the address it listens on (a non-loopback one: hops.non_loopback_address)

    def __post_init__(self) -> None:
        self.stop = threading.Event()
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                parts = urllib.parse.urlsplit(self.path)
                req = Request(parts.path, dict(urllib.parse.parse_qsl(parts.query)), dict(self.headers.items()))
                with server.lock:
                    server.requests.append(req)
                reply = server.reply_for(req)
                try:
                    server.send(self, reply)
                except OSError:
                    pass  # the client gave up (its deadline): what the trickle tests want

        self.httpd = http.server.ThreadingHTTPServer((self.host, 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.httpd.server_address[1]}"

    def reply_for(self, req: Request) -> Reply:
        for pattern, reply in self.routes.items():
            if re.fullmatch(pattern, req.path):
                return reply(req) if callable(reply) else reply
        return Reply(404, b'{"error": "no such route"}')

    def send(self, handler: http.server.BaseHTTPRequestHandler, reply: Reply) -> None:
        if reply.delay_s:
            self.stop.wait(reply.delay_s)
        if reply.mode == "hang":
            self.stop.wait(30.0)
            return
        reason = "OK" if reply.status == 200 else "Error"
        head = (
            f"HTTP/1.1 {reply.status} {reason}\r\nContent-Type: {reply.content_type}\r\n"
            + "".join(f"{name}: {value}\r\n" for name, value in reply.headers.items())
            + f"Content-Length: {len(reply.body)}\r\n\r\n"
        ).encode()
        data = head + reply.body
        if reply.mode == "trickle":
            for i in range(len(data)):
                if self.stop.wait(0.05):
                    return
                handler.wfile.write(data[i : i + 1])
                handler.wfile.flush()
            return
        handler.wfile.write(data)
        handler.wfile.flush()

    def paths(self) -> list[str]:
        with self.lock:
            return [r.path for r in self.requests]

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


class Clock:
    """Wall-clock unix seconds that only move when a test moves them."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def inline(run: Callable[[], None]) -> None:
    """Run a background refresh at once, so a test sees its outcome on the next line."""
    run()
