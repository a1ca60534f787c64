"""The extender's worker answers what gunicorn's parser would refuse as gunicorn does, on the
verbs' own path too, at once where it can, counted; and a stopping worker does not drop a
request already on its way over a kept-alive connection."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from joulesched.extender.demo import stop
from tests.extender.support import make_pod
from tests.extender.test_worker import raw, start

BODY = orjson.dumps({"Pod": make_pod(), "NodeNames": ["efficient", "hungry", "capped"]})


def request(path: bytes, body: bytes = BODY, headers: bytes = b"Host: x\r\n") -> bytes:
    return b"POST " + path + b" HTTP/1.1\r\n" + headers + b"Content-Length: %d\r\n\r\n" % len(body) + body


@pytest.fixture
def extender(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    proc, port = start(tmp_path, {"workers": 1, "threads": 2, "request_timeout_seconds": 10})
    try:
        yield proc, port
    finally:
        stop(proc)


def status_and_error(reply: bytes) -> tuple[int, str]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), orjson.loads(body)["Error"]


def failures(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("joulesched_extender_failures_total{")
    }


@pytest.mark.parametrize(
    ("data", "status"),
    [
        # a 70 KB head that comes whole in one read was served (200); in pieces it was 431
        (request(b"/scheduler/filter", headers=b"Host: x\r\nX-Pad: " + b"a" * 70_000 + b"\r\n"), 431),
        (request(b"/scheduler/" + b"a" * 9_000), 414),  # was a 404 naming the 9 KB verb
        (request(b"/scheduler/filter", headers=b"Host: x\r\nX-Odd : 1\r\n"), 400),  # whitespace before the colon
        (request(b"/scheduler/filter", headers=b"Host: x\r\nno colon here\r\n"), 400),
        (request(b"/scheduler/filter", headers=b"".join(b"X-H%d: 1\r\n" % i for i in range(101))), 431),
        (request(b"/scheduler/filter", headers=b"Host: x\r\nX Y: z\r\n"), 400),  # a name that is no token
        (request(b"/scheduler/filter", headers=b"Host: x\r\nX-A: b\x00c\r\n"), 400),  # a NUL in a value
        # 8,189 bytes and its CRLF: over gunicorn's 8,190 (it counts the CRLF)
        (request(b"/scheduler/filter", headers=b"Host: x\r\nX-B: " + b"a" * 8184 + b"\r\n"), 431),
    ],
    ids=["head-over-64KiB", "request-line-over-limit", "space-before-colon", "no-colon", "101-headers",
         "name-not-a-token", "nul-in-value", "header-line-over-limit"],
)
def test_a_head_gunicorn_refuses_is_refused_on_the_verbs_path_too(
    extender: tuple[subprocess.Popen[bytes], int], data: bytes, status: int
) -> None:
    _, port = extender
    assert status_and_error(raw(port, data))[0] == status


def test_an_oversize_body_that_expects_100_continue_gets_413_alone(extender: tuple[subprocess.Popen[bytes], int]) -> None:
    _, port = extender
    head = b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 20000000\r\n\r\n"
    reply = raw(port, head)
    assert reply.startswith(b"HTTP/1.1 413 ")  # not "100 Continue" first: its 20 MB are not wanted
    assert b"100 Continue" not in reply


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (bytes.fromhex("16030100c4010000c00303") + bytes(40), "a TLS handshake on a plain-HTTP port"),
        (b"GET /healthz HTTP/1.1\nHost: x\n\n", "malformed request line"),  # a bare LF
    ],
    ids=["tls-client-hello", "bare-lf"],
)
def test_bytes_that_cannot_begin_a_request_are_answered_at_once_not_at_the_read_deadline(
    extender: tuple[subprocess.Popen[bytes], int], data: bytes, said: str
) -> None:
    _, port = extender
    began = time.monotonic()
    status, error = status_and_error(raw(port, data))
    assert time.monotonic() - began < 5.0  # the read deadline is 10 s
    assert status == 400 and error.startswith(said)
    assert failures(port)['joulesched_extender_failures_total{reason="bad_request_line",verb="http"}'] == 1.0


def test_a_request_line_still_arriving_over_the_limit_is_answered_414_at_once(
    extender: tuple[subprocess.Popen[bytes], int],
) -> None:
    # gunicorn's read_line refuses a line without its CRLF once it is over limit_request_line
    # (8,190 as deployed); before, the worker waited for 64 KiB or the read deadline (408).
    _, port = extender
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=8) as s:
        s.sendall(b"GET /" + b"a" * 9000)  # and nothing more
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    status, error = status_and_error(reply)
    assert time.monotonic() - began < 5.0  # the read deadline is 10 s
    assert status == 414 and error == "malformed request: Request Line is too large (9005 > 8190)", error
    assert failures(port)['joulesched_extender_failures_total{reason="malformed",verb="http"}'] == 1.0
    # its CRLF come, the rest of the head not (yet): refused at once too, sized as gunicorn sizes it
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=8) as s:
        s.sendall(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n")  # no empty line
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    status, error = status_and_error(reply)
    assert time.monotonic() - began < 5.0
    assert status == 414 and error == "malformed request: Request Line is too large (9014 > 8190)", error


def test_paths_flask_answers_404_and_405_are_counted(extender: tuple[subprocess.Popen[bytes], int]) -> None:
    _, port = extender
    assert status_and_error(raw(port, request(b"/sched/filter", headers=b"Host: x\r\nConnection: close\r\n")))[0] == 404
    assert status_and_error(raw(port, request(b"/healthz", headers=b"Host: x\r\nConnection: close\r\n")))[0] == 405
    counted = failures(port)
    assert counted['joulesched_extender_failures_total{reason="unknown_path",verb="other"}'] == 1.0
    assert counted['joulesched_extender_failures_total{reason="method",verb="other"}'] == 1.0


def test_a_stopping_worker_answers_a_request_on_its_way_with_connection_close(
    extender: tuple[subprocess.Popen[bytes], int],
) -> None:
    """A reply that announced keep-alive, then SIGTERM: the client's next request, sent 100 ms
    later, is answered, with Connection: close (it was drained and dropped)."""
    proc, port = extender
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request(b"/scheduler/filter"))
        first = s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ") and b"Connection: close" not in first
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.1)
        s.sendall(request(b"/scheduler/prioritize"))
        second = b""
        while chunk := s.recv(65536):
            second += chunk
    assert second.startswith(b"HTTP/1.1 200 ") and b"Connection: close\r\n" in second
    assert orjson.loads(second.partition(b"\r\n\r\n")[2])[0]["Host"] == "efficient"
