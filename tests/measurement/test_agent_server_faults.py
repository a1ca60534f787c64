"""The agent's HTTP server under hostile or broken clients, in-process on loopback.

Raw sockets send what urllib will not: malformed Content-Length, invalid UTF-8, JSON nested
30,000 deep, a 10 MB body without a token, hundreds of idle connections.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.measurement.agent_server_support import Running

_BUFFERS: dict[int, bytes] = {}  # bytes received past the last response, per socket


def connect(r: Running, timeout: float = 10.0) -> socket.socket:
    host, port = r.server.server_address[:2]
    sock = socket.create_connection((str(host), int(port)), timeout=timeout)
    _BUFFERS.pop(sock.fileno(), None)
    return sock


def response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP response (status, headers, body) from a raw socket; bytes of the responses
    after it (pipelining) are kept for the next call."""
    data = _BUFFERS.pop(sock.fileno(), b"")
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed without a reply after {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    if rest[length:]:
        _BUFFERS[sock.fileno()] = rest[length:]
    return status, headers, rest[:length]


def post(headers: str, body: bytes = b"") -> bytes:
    return f"POST /v1/windows HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode() + body


NESTED = b"[" * 30_000 + b"]" * 30_000
NOT_UTF8 = b'{"label": "\xff"}'


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (post("Content-Length: abc\r\n"), 400),
        (post("Content-Length: -1\r\n"), 400),
        (post(f"Content-Length: {len(NESTED)}\r\n", NESTED), 400),
        (post(f"Content-Length: {len(NOT_UTF8)}\r\n", NOT_UTF8), 400),
        (post("Content-Length: 9\r\n", b"{not json"), 400),
        (post("Content-Length: 100000\r\n"), 413),
        (post("Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n"), 411),
    ],
    ids=[
        "a non-numeric Content-Length gets a JSON 400",
        "a negative Content-Length gets a JSON 400",
        "JSON nested 30,000 deep gets a JSON 400",
        "a body that is not UTF-8 gets a JSON 400",
        "a body that is not JSON gets a JSON 400",
        "a body above 64 KiB gets a 413 unread",
        "a chunked body gets a 411",
    ],
)
def test_malformed_requests_get_a_clear_json_reply(running: Running, request_bytes: bytes, status: int) -> None:
    with connect(running) as sock:
        sock.sendall(request_bytes)
        got, headers, body = response(sock)
    assert got == status
    assert headers["content-type"] == "application/json"
    assert "error" in json.loads(body)


def test_a_big_body_without_a_token_is_refused_before_it_is_read(with_token: Running) -> None:
    size = 10 * 1024 * 1024
    with connect(with_token, timeout=5.0) as sock:
        sock.sendall(post(f"Content-Length: {size}\r\nContent-Type: application/json\r\n", b"{" + b" " * 1023))
        status, headers, _ = response(sock)  # answered with 1 KiB of the 10 MB sent
        assert status == 401
        assert headers.get("connection") == "close"
        assert sock.recv(1) == b""  # and closed: the rest is never read


def test_rss_stays_flat_under_a_10_mb_unauthorised_body(with_token: Running) -> None:
    def rss() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak
    except OSError:
        pytest.skip("the peak RSS cannot be reset here")
    before = rss()
    size = 10 * 1024 * 1024
    with connect(with_token, timeout=5.0) as sock:
        head = post(f"Content-Length: {size}\r\n")
        sender = threading.Thread(target=_send_quietly, args=(sock, head, size))
        sender.start()
        status, _, _ = response(sock)
        sender.join(timeout=10)
    assert status == 401
    assert rss() - before < 5 * 1024 * 1024  # the body was never held in memory


def _send_quietly(sock: socket.socket, head: bytes, size: int) -> None:
    """Stream the headers and ``size`` bytes of body in 64 KiB pieces (none held whole)."""
    piece = b"x" * 65536
    try:
        sock.sendall(head)
        for _ in range(size // len(piece)):
            sock.sendall(piece)
    except OSError:
        pass  # the server closed after answering 401


def test_idle_connections_take_no_threads_and_do_not_block_requests(running: Running) -> None:
    threads_before = threading.active_count()
    idle = [connect(running) for _ in range(200)]
    try:
        time.sleep(0.5)
        assert threading.active_count() - threads_before <= 20
        started = time.monotonic()
        assert running.request("GET", "/healthz")[0] in (200, 503)
        assert time.monotonic() - started < 2.0
        assert threading.active_count() - threads_before <= 20
    finally:
        for sock in idle:
            sock.close()


def test_keep_alive_and_pipelined_requests_are_all_answered(running: Running) -> None:
    running.step()
    get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with connect(running) as sock:
        sock.sendall(get)
        assert response(sock)[0] == 200
        time.sleep(0.2)  # the connection waits without a thread, then serves the next request
        sock.sendall(get)
        assert response(sock)[0] == 200
        sock.sendall(get * 3)
        assert [response(sock)[0] for _ in range(3)] == [200, 200, 200]


def test_a_stalled_request_is_dropped_after_the_read_timeout(running: Running) -> None:
    running.server.read_timeout = 0.3
    with connect(running) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # headers never finished
        started = time.monotonic()
        assert sock.recv(1024) == b""
        assert time.monotonic() - started < 5.0


def test_the_listen_backlog_is_not_the_default_five(running: Running) -> None:
    assert running.server.request_queue_size >= 128


def test_past_the_connection_limit_the_longest_idle_makes_room(running: Running) -> None:
    running.server.max_connections = 50
    idle = [connect(running) for _ in range(80)]
    try:
        time.sleep(0.5)
        assert running.request("GET", "/healthz")[0] in (200, 503)  # not locked out
        assert idle[0].recv(1) == b""  # the first idle connection was closed to make room
    finally:
        for sock in idle:
            sock.close()
