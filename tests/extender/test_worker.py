"""The extender's gunicorn worker (extender/worker.py): idle, slow and lying clients hold no thread.

The server here has one worker with ONE thread: under gunicorn's ``gthread`` any of the
attackers below would hold that thread and the kept-alive client would get no answer at all.
"""

from __future__ import annotations

import http.client
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
import yaml

from joulesched.extender import worker as worker_module
from joulesched.extender.demo import free_port, start_extender, stop, wait_ready
from joulesched.extender.worker import (
    NEXT_REQUEST_SECONDS,
    FrontBody,
    FrontBufferedWorker,
    _body_length,
    _direct_verb,
    bind_pool,
)
from tests.extender.support import PROFILES, make_pod
from tests.support import trickle

BODY = orjson.dumps({"Pod": make_pod(), "NodeNames": ["efficient", "hungry", "capped"]})


def start(
    tmp_path: Path, server: dict[str, object], max_request_bytes: int = 1 << 20, **settings: object
) -> tuple[subprocess.Popen[bytes], int]:
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump(PROFILES))
    config = {"profiles": {"file": {"path": "nodes.yaml"}}, "max_request_bytes": max_request_bytes, "server": server, **settings}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = start_extender(tmp_path / "config.yaml", port, tmp_path / "extender.log")
    wait_ready(port, proc)
    return proc, port


@pytest.fixture
def one_thread(tmp_path: Path) -> Iterator[int]:
    proc, port = start(tmp_path, {"workers": 1, "threads": 1, "request_timeout_seconds": 1.5})
    try:
        yield port
    finally:
        stop(proc)


def raw(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return reply


def prioritize(conn: http.client.HTTPConnection) -> int:
    conn.request("POST", "/scheduler/prioritize", BODY, {"Content-Type": "application/json"})
    reply = conn.getresponse()
    assert orjson.loads(reply.read())[0]["Host"] == "efficient"
    return reply.status


def test_idle_slow_and_lying_clients_do_not_hold_the_only_thread(one_thread: int) -> None:
    port = one_thread
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(6)]  # idle
    head = b"POST /scheduler/prioritize HTTP/1.1\r\nHost: x\r\n"
    for s in held[:2]:
        s.sendall(head)  # slowloris: a head that never ends
    held[2].sendall(head + b"Content-Length: 100000\r\n\r\n{")  # a body that never comes
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        for _ in range(10):
            for s in held[:3]:
                s.sendall(b"X")
            assert prioritize(conn) == 200
    finally:
        conn.close()
        for s in held:
            s.close()


def test_a_body_length_written_with_leading_zeros_is_read_by_the_event_loop_too(one_thread: int) -> None:
    # Gunicorn's parser reads "0000000000000000000100" as 100. Taken for an oversize length, the
    # body went to the only thread unread, which then waited on it byte by byte, each within
    # the read timeout: a client trickling it held the thread for as long as it liked.
    port = one_thread
    trickler = socket.create_connection(("127.0.0.1", port))
    trickler.sendall(b"POST /scheduler/prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: 0000000000000000000100\r\n\r\n{")
    stop = threading.Event()
    thread = threading.Thread(target=trickle, args=(trickler, stop, 0.5), daemon=True)  # within the 1.5 s read timeout
    thread.start()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
    try:
        time.sleep(0.3)
        for _ in range(3):
            assert prioritize(conn) == 200
            time.sleep(1.0)
    finally:
        stop.set()
        thread.join()
        conn.close()
        trickler.close()


def test_a_body_that_never_arrives_gets_a_counted_json_408_and_the_connection_closed(one_thread: int) -> None:
    started = time.monotonic()
    reply = raw(one_thread, b'POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"Pod"')
    assert time.monotonic() - started >= 1.4
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in head
    assert "within 1.5 s" in orjson.loads(body)["Error"]
    conn = http.client.HTTPConnection("127.0.0.1", one_thread, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    assert re.search(r'joulesched_extender_failures_total\{reason="read_timeout",verb="http"\} 1\.0', text), text


def test_chunked_bodies_get_411_and_a_long_head_431(one_thread: int) -> None:
    reply = raw(
        one_thread,
        b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
    )
    assert (
        reply.startswith(b"HTTP/1.1 411 ")
        and "Content-Length" in orjson.loads(reply.partition(b"\r\n\r\n")[2])["Error"]
    )
    reply = raw(one_thread, b"POST /scheduler/filter HTTP/1.1\r\n" + b"X-a: b\r\n" * 10_000)
    assert reply.startswith(b"HTTP/1.1 431 ")


@pytest.mark.parametrize(
    ("data", "status", "names"),
    [
        (b"GARBAGE\r\n\r\n", 400, "GARBAGE"),
        (b"POST /scheduler/filter HTTP/1.1\r\nContent-Length: ten\r\n\r\n", 400, "CONTENT-LENGTH"),
        (b"POST /scheduler/filter HTTP/1.1\r\nContent-Length: " + b"0" * 5000 + b"1\r\n\r\n", 400, "CONTENT-LENGTH"),
        (b"GET /metrics HTTP/1.1\r\nBad Name: x\r\n\r\n", 400, "Bad Name"),
        (b"POST /scheduler/filter HTTP/9.9\r\n\r\n", 400, "(9, 9)"),
        (b"POST /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414, "too large"),
    ],
    ids=["request line", "Content-Length", "Content-Length past int()'s digits", "header name", "HTTP version", "request line too long"],
)
def test_a_request_gunicorns_parser_refuses_gets_its_status_as_counted_json(
    one_thread: int, data: bytes, status: int, names: str
) -> None:
    reply = raw(one_thread, data)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status) and b"Connection: close" in head, reply[:300]
    assert b"Content-Type: application/json" in head
    message = orjson.loads(body)["Error"]
    assert message.startswith("malformed request: ") and names in message, message
    conn = http.client.HTTPConnection("127.0.0.1", one_thread, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    assert re.search(r'joulesched_extender_failures_total\{reason="malformed",verb="http"\} 1\.0', text), text


def test_an_oversize_body_is_refused_unread_with_connection_close(one_thread: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", one_thread, timeout=5)
    conn.putrequest("POST", "/scheduler/filter")
    conn.putheader("Content-Length", str(2 << 20))
    conn.endheaders()
    reply = conn.getresponse()
    assert reply.status == 413 and reply.getheader("Connection") == "close"
    assert "max_request_bytes" in orjson.loads(reply.read())["Error"]
    conn.close()


def test_pipelined_and_expect_continue_requests_are_answered(one_thread: int) -> None:
    one = b"POST /scheduler/prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    with socket.create_connection(("127.0.0.1", one_thread), timeout=5) as s:
        s.sendall(one + one)
        got = b""
        while got.count(b"efficient") < 2:
            got += s.recv(65536)
        assert got.count(b"HTTP/1.1 200 ") == 2
        s.sendall(
            b"POST /scheduler/prioritize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
            % len(BODY)
        )
        assert s.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(BODY)
        got = b""
        while b"efficient" not in got:
            got += s.recv(65536)
        assert got.startswith(b"HTTP/1.1 200 ") and b"100 Continue" not in got


def test_the_direct_verb_path_speaks_http_like_gunicorn(one_thread: int) -> None:
    # kube-scheduler's requests skip gunicorn's parser; what it answers must not change.
    def head_of(reply: bytes) -> tuple[str, dict[str, str], bytes]:
        head, _, body = reply.partition(b"\r\n\r\n")
        status, *lines = head.decode().split("\r\n")
        return status, {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}, body

    req = b"POST /scheduler/prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n%s"
    # Connection: close is honoured (and said), the reply is whole
    status, headers, body = head_of(raw(one_thread, req % (len(BODY), b"Connection: close\r\n", BODY)))
    assert status == "HTTP/1.1 200 OK" and headers["connection"] == "close"
    assert headers["content-type"] == "application/json" and int(headers["content-length"]) == len(body)
    assert orjson.loads(body)[0]["Host"] == "efficient"
    # verbs' errors keep their statuses and JSON: an unknown verb, an empty body, bad JSON
    for verb, payload, want in ((b"nope", BODY, "404"), (b"filter", b"", "400"), (b"filter", b"{", "400")):
        one = b"POST /scheduler/%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (verb, len(payload), payload)
        status, headers, body = head_of(raw(one_thread, one))
        assert status.split()[1] == want and "Error" in orjson.loads(body), (verb, status, body)
    # HTTP/1.0, a query string and other methods go through gunicorn and Flask, answered the same way
    old = b"POST /scheduler/prioritize HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    status, headers, body = head_of(raw(one_thread, old))
    assert status.startswith("HTTP/1.0 200") and orjson.loads(body)[0]["Host"] == "efficient"
    query = b"POST /scheduler/prioritize?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    assert orjson.loads(head_of(raw(one_thread, query))[2])[0]["Host"] == "efficient"
    status, _, body = head_of(raw(one_thread, b"GET /scheduler/filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    assert status.split()[1] == "405" and "POST" in orjson.loads(body)["Error"]
    # a verb request after a gunicorn-parsed one on the same kept-alive connection, and back
    conn = http.client.HTTPConnection("127.0.0.1", one_thread, timeout=5)
    for path in ("/healthz", "/scheduler/prioritize", "/readyz", "/scheduler/prioritize"):
        if path.startswith("/scheduler"):
            assert prioritize(conn) == 200
        else:
            conn.request("GET", path)
            reply = conn.getresponse()
            assert reply.status == 200 and reply.read().startswith(b"ok")
    conn.close()


def test_a_kept_alive_clients_next_request_is_answered_however_it_comes(one_thread: int) -> None:
    # The thread that answered a request answers the next one when it comes whole and soon
    # (extender/worker.py, NEXT_REQUEST_SECONDS); in parts, two at once, late or broken, the
    # event loop reads it. Every way gets its answer, on the one thread, in order.
    one = b"POST /scheduler/prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)

    def answers(s: socket.socket, count: int) -> bytes:
        got = b""
        while got.count(b"efficient") < count:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        assert got.count(b"HTTP/1.1 200 ") == count, got
        return got

    with socket.create_connection(("127.0.0.1", one_thread), timeout=5) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(20):  # back to back, as kube-scheduler sends them
            s.sendall(one)
            answers(s, 1)
        s.sendall(one)
        answers(s, 1)
        s.sendall(one[:40])  # the next in parts, the rest after the thread stopped waiting
        time.sleep(NEXT_REQUEST_SECONDS + 0.05)
        s.sendall(one[40:])
        answers(s, 1)
        s.sendall(one + one)  # two at once
        answers(s, 2)
        s.sendall(one)
        answers(s, 1)
        time.sleep(NEXT_REQUEST_SECONDS + 0.05)  # late
        s.sendall(one)
        answers(s, 1)
        s.sendall(one)
        answers(s, 1)
        s.sendall(b"POST /scheduler/prioritize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        got = b""
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        assert got.startswith(b"HTTP/1.1 411 "), got  # the event loop's rule, as before
    # and the one thread still answers others
    conn = http.client.HTTPConnection("127.0.0.1", one_thread, timeout=5)
    assert prioritize(conn) == 200
    conn.close()


def test_half_the_threads_at_most_wait_for_a_next_request(tmp_path: Path) -> None:
    # Two threads: after A's and then B's reply, A's thread waits NEXT_REQUEST_SECONDS for A's
    # next request, B's may not (one of two is half), so C, right behind, is answered at once.
    # Were both waiting, C would wait until A's thread gave up: NEXT_REQUEST_SECONDS less the
    # few milliseconds between A's reply and C's request.
    proc, port = start(tmp_path, {"workers": 1, "threads": 2})
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=5) for _ in range(3)]
    try:
        waits = []
        for _ in range(5):
            time.sleep(NEXT_REQUEST_SECONDS + 0.05)  # no thread waits from the last round
            a, b, c = conns
            assert prioritize(a) == 200 and prioritize(b) == 200
            started = time.monotonic()
            assert prioritize(c) == 200
            waits.append(time.monotonic() - started)
        assert min(waits) < NEXT_REQUEST_SECONDS / 2, waits
    finally:
        for conn in conns:
            conn.close()
        stop(proc)


PRIORITIZE = b"POST /scheduler/prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
_BINDING = orjson.dumps({"PodName": "p", "PodNamespace": "default", "PodUID": "u-1", "Node": "efficient"})
BIND = b"POST /scheduler/bind HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(_BINDING), _BINDING)


def api_kubeconfig(tmp_path: Path, port: int) -> str:
    """A kubeconfig for an API server on 127.0.0.1:``port`` (the binder's; none real here)."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}", "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))
    return str(path)


def test_a_binding_the_api_server_never_answers_holds_a_bind_thread_and_no_decision_thread(tmp_path: Path) -> None:
    # An API server that accepts connections and never answers (the TLS handshake never
    # completes): each bind holds a thread of bind.threads until the binder's timeout, and the
    # one server.thread still answers prioritize at once, whether a bind came on its own
    # connection or right after a prioritize on the decision's (handed from that thread).
    silent = socket.create_server(("127.0.0.1", 0))
    kubeconfig = api_kubeconfig(tmp_path, silent.getsockname()[1])
    proc, port = start(tmp_path, {"workers": 1, "threads": 1}, kubeconfig=kubeconfig, bind={"enabled": True, "threads": 2})
    try:
        alone = socket.create_connection(("127.0.0.1", port), timeout=10)
        alone.sendall(BIND)
        after = socket.create_connection(("127.0.0.1", port), timeout=10)
        after.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        after.sendall(PRIORITIZE)
        assert b"efficient" in after.recv(65536)
        after.sendall(BIND)  # at once: the one decision thread may read it, and hands it on
        deadline = time.monotonic() + 2  # well inside the binder's 5 s timeout
        while (in_flight := metric(port, "joulesched_extender_binds_in_flight")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert in_flight == 2, "the two bindings are not both waiting on the API server"
        for _ in range(3):
            started = time.monotonic()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            assert prioritize(conn) == 200
            conn.close()
            assert time.monotonic() - started < 1.0  # kube-scheduler's httpTimeout in deploy/
            assert metric(port, "joulesched_extender_binds_in_flight") == 2  # answered while both wait
        alone.close()
        after.close()
    finally:
        stop(proc)
        silent.close()


def test_a_bind_and_a_decision_back_to_back_on_one_connection_each_go_to_their_own_threads(tmp_path: Path) -> None:
    # kube-scheduler's bind goroutine takes the connection the scheduling loop has just used,
    # so a prioritize and the pod's bind often come back to back on one connection, and the
    # next pod's filter after the bind. Each goes to its own pool (bind.threads, server.threads)
    # from the thread that read it, and each is answered, in order. No API server here: the
    # binder's error is the bind's answer, as kube-scheduler would get it.
    kubeconfig = api_kubeconfig(tmp_path, free_port())  # nothing listens there
    proc, port = start(tmp_path, {"workers": 1, "threads": 1}, kubeconfig=kubeconfig, bind={"enabled": True, "threads": 1, "wait_seconds": 0})
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(20):
                s.sendall(PRIORITIZE)
                assert answer(s)[0]["Host"] == "efficient"  # type: ignore[index]
                s.sendall(BIND)  # at once: the decision's thread is still waiting for it
                reply = answer(s)
                assert isinstance(reply, dict) and "binding default/p to efficient" in str(reply["Error"]), reply
        assert metric(port, 'joulesched_extender_requests_total{code="200",verb="bind"}') == 20
        assert metric(port, 'joulesched_extender_requests_total{code="200",verb="prioritize"}') == 20
    finally:
        stop(proc)


def answer(s: socket.socket) -> dict[str, object] | list[object]:
    """The next reply on ``s``, a 200, its JSON body read."""
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(65536)
        assert chunk, got
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, got
        body += chunk
    assert head.startswith(b"HTTP/1.1 200 ") and len(body) == length, got
    return orjson.loads(body)


def bind_request(pod: str) -> bytes:
    body = orjson.dumps({"PodName": pod, "PodNamespace": "default", "PodUID": f"uid-{pod}", "Node": "efficient"})
    return b"POST /scheduler/bind HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def verb_request(verb: str, uid: str) -> bytes:
    body = orjson.dumps({"Pod": make_pod(uid=uid, name=uid), "NodeNames": ["efficient", "hungry", "capped"]})
    return b"POST /scheduler/%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (verb.encode(), len(body), body)


def test_only_binds_that_write_have_threads_of_their_own() -> None:
    from joulesched.extender.config import parse_config

    assert bind_pool(parse_config({"bind": {"enabled": True, "write": False}}, "t.yaml")) is None
    assert bind_pool(parse_config({"bind": {"enabled": False, "threads": 3}}, "t.yaml")) is None
    pool = bind_pool(parse_config({"bind": {"enabled": True, "threads": 3}}, "t.yaml"))
    assert pool is not None and pool._max_workers == 3
    pool.shutdown()


def worker_threads(master: subprocess.Popen[bytes]) -> int:
    """The threads of the extender's one gunicorn worker (the master's child)."""
    (worker,) = Path(f"/proc/{master.pid}/task/{master.pid}/children").read_text().split()
    found = re.search(r"^Threads:\s+(\d+)$", Path(f"/proc/{worker}/status").read_text(), re.M)
    assert found is not None
    return int(found.group(1))


def test_binds_that_write_nothing_are_served_by_the_decisions_threads_while_a_decision_waits_for_them(tmp_path: Path) -> None:
    # bind.write: false: a bind records where kube-scheduler placed the pod and answers at once,
    # so it has no bind.threads of its own: server.threads serve it, on the connection it came
    # on or another, and no thread is started for it. A decision waiting for the bindings of the
    # pods answered before it (bind.wait_seconds) holds one of the three; another answers the
    # bind it waits for.
    proc, port = start(tmp_path, {"workers": 1, "threads": 3}, bind={"enabled": True, "write": False, "wait_seconds": 0.5})
    try:
        connect = partial(socket.create_connection, ("127.0.0.1", port), timeout=10)
        with connect() as decisions, connect() as binds:
            for s in (decisions, binds):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def bind(s: socket.socket, pod: str) -> None:
                s.sendall(bind_request(pod))
                assert f"default/{pod} on efficient recorded; kube-scheduler binds it (bind.write: false)" in str(answer(s))

            def decide(s: socket.socket, verb: str, uid: str) -> None:
                s.sendall(verb_request(verb, uid))
                reply = answer(s)
                assert "efficient" in str(reply), reply

            decide(decisions, "prioritize", "uid-a")
            bind(decisions, "a")  # a bind of a pod it answered: from now on, decisions wait for bindings
            # Every one of the three threads started: three filters at once, each waiting (to the
            # deadline) for the binding of b, which never comes.
            decide(decisions, "prioritize", "uid-b")
            waiting = [connect() for _ in range(3)]
            for i, s in enumerate(waiting):
                s.sendall(verb_request("filter", f"uid-w{i}"))
            for i, s in enumerate(waiting):
                assert "efficient" in str(answer(s))
                bind(binds, f"w{i}")
                s.close()
            threads = worker_threads(proc)
            deadlines = metric(port, 'joulesched_extender_bind_waits_total{outcome="deadline"}')
            assert deadlines >= 1
            for pod, after in (("c", "d"), ("e", "f")):
                decide(decisions, "prioritize", f"uid-{pod}")
                bind(decisions, pod)  # on the decision's connection, as kube-scheduler often sends it
                decide(decisions, "prioritize", f"uid-{after}")
                decisions.sendall(verb_request("filter", f"uid-{after}x"))  # waits for {after}'s binding
                time.sleep(0.2)
                bind(binds, after)  # on another connection, while the filter waits
                reply = answer(decisions)
                assert isinstance(reply, dict) and "efficient" in reply["NodeNames"], reply  # type: ignore[operator]
                bind(binds, f"{after}x")  # the filtered pod's own: the next decision has none to wait for
            # The bindings came while the filters waited, and were answered by threads already there.
            assert metric(port, 'joulesched_extender_bind_waits_total{outcome="bound"}') >= 1
            assert metric(port, 'joulesched_extender_bind_waits_total{outcome="deadline"}') == deadlines
            assert worker_threads(proc) == threads
        assert metric(port, 'joulesched_extender_requests_total{code="200",verb="bind"}') == 10
    finally:
        stop(proc)


class HeldApiServer:
    """An API server that holds every connection until released, then closes each (the
    binder's error comes at once): a binding waits on it as long as a test needs."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.held: list[socket.socket] = []
        self.released = threading.Event()
        self.accepted = threading.Event()  # a connection came (the gauge counts a binding before it connects)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                s, _ = self.listener.accept()
            except OSError:
                return
            if self.released.is_set():
                s.close()
            else:
                self.held.append(s)
            self.accepted.set()

    def release(self) -> None:
        self.released.set()
        for s in self.held:
            s.close()

    def close(self) -> None:
        self.release()
        self.listener.close()


def test_a_bind_whose_client_hung_up_while_it_waited_for_a_thread_is_not_sent(tmp_path: Path) -> None:
    # kube-scheduler closes the connection when its httpTimeout passes and goes on without the
    # answer: ignorable, it binds the pod itself; not, it schedules the pod again. A bind still
    # queued for a thread then is not sent to the API server (it would land after kube-scheduler
    # let the node go), and is counted as code 499; a bind whose client still waits is sent.
    # The one bind thread is taken by p0 while p1 and p2 are queued and their clients hang up.
    api = HeldApiServer()
    kubeconfig = api_kubeconfig(tmp_path, api.listener.getsockname()[1])
    proc, port = start(tmp_path, {"workers": 1, "threads": 1}, kubeconfig=kubeconfig, bind={"enabled": True, "threads": 1, "wait_seconds": 0})
    try:
        clients = {}
        for pod in ("p0", "p1", "p2", "p3"):
            clients[pod] = socket.create_connection(("127.0.0.1", port), timeout=10)
            clients[pod].sendall(bind_request(pod))
            if pod == "p0":
                deadline = time.monotonic() + 5
                while metric(port, "joulesched_extender_binds_in_flight") < 1 and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert api.accepted.wait(10), "p0's binding never reached the API server"
        time.sleep(0.3)  # p1, p2 and p3 read and queued behind p0
        clients.pop("p1").close()
        clients.pop("p2").close()
        time.sleep(0.1)
        api.release()
        for pod, s in clients.items():
            got = b""
            while not got.endswith(b"}"):
                chunk = s.recv(65536)
                assert chunk, (pod, got)
                got += chunk
            assert got.startswith(b"HTTP/1.1 200 ") and f"binding default/{pod} to efficient: ".encode() in got, (pod, got)
            s.close()
        assert metric(port, 'joulesched_extender_requests_total{code="499",verb="bind"}', 0) == 2
        assert metric(port, 'joulesched_extender_failures_total{reason="client_gone",verb="bind"}', 0) == 2
        assert metric(port, 'joulesched_extender_requests_total{code="200",verb="bind"}') == 2
        log = (tmp_path / "extender.log").read_text()
        sent = sorted(set(re.findall(r"bind default/(p\d) to efficient failed", log)))
        assert sent == ["p0", "p3"], log[-3000:]
    finally:
        stop(proc)
        api.close()


def test_a_bind_queued_for_a_bind_thread_holds_the_next_decision_to_the_api_servers_pace(tmp_path: Path) -> None:
    # With the one bind thread waiting on the API server for p0's binding, p1's bind queues
    # for it unrecorded, and the next pod's filter waits for p1's binding to its deadline
    # (bind.wait_seconds): kube-scheduler sends no more binds while the API server takes none.
    api = HeldApiServer()
    kubeconfig = api_kubeconfig(tmp_path, api.listener.getsockname()[1])
    proc, port = start(tmp_path, {"workers": 1, "threads": 2}, kubeconfig=kubeconfig, bind={"enabled": True, "threads": 1, "wait_seconds": 0.5})
    try:
        connect = partial(socket.create_connection, ("127.0.0.1", port), timeout=10)
        with connect() as decisions, connect() as first, connect() as second:
            for s in (decisions, first, second):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            decisions.sendall(verb_request("prioritize", "uid-p0"))
            answer(decisions)
            first.sendall(bind_request("p0"))  # takes the one bind thread, held by the API server
            assert api.accepted.wait(10), "p0's binding never reached the API server"
            decisions.sendall(verb_request("prioritize", "uid-p1"))
            answer(decisions)
            second.sendall(bind_request("p1"))  # read, and queued behind p0 for the bind thread
            time.sleep(0.3)
            started = time.monotonic()
            decisions.sendall(verb_request("filter", "uid-p2"))
            reply = answer(decisions)
            waited = time.monotonic() - started
            assert isinstance(reply, dict) and "efficient" in reply["NodeNames"], reply  # type: ignore[operator]
            assert waited >= 0.45, f"the filter went on after {waited:.2f} s, with p1's bind still queued"
            assert metric(port, 'joulesched_extender_bind_waits_total{outcome="deadline"}', 0) == 1
            api.release()
            for pod, s in (("p0", first), ("p1", second)):
                got = answer(s)
                assert isinstance(got, dict) and f"binding default/{pod} to efficient: " in str(got["Error"]), got
        log = (tmp_path / "extender.log").read_text()
        assert sorted(set(re.findall(r"bind default/(p\d) to efficient failed", log))) == ["p0", "p1"], log[-3000:]
    finally:
        stop(proc)
        api.close()


def metric(port: int, series: str, default: float | None = None) -> float:
    """The value of ``series`` (a name and its labels as exposed) in the extender's /metrics
    (each read is a connection); ``default`` when it is not there."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    if match is None and default is not None:
        return default
    assert match, text
    return float(match.group(1))


def connections_accepted(port: int) -> float:
    return metric(port, "joulesched_extender_connections_total")


def test_connections_are_counted_once_each_however_many_requests_they_carry(one_thread: int) -> None:
    # joulesched_extender_connections_total: how often the client opened a connection (each
    # /metrics read here is one more); a kept-alive one carrying many requests counts once.
    before = connections_accepted(one_thread)
    kept = http.client.HTTPConnection("127.0.0.1", one_thread, timeout=5)
    for _ in range(5):
        assert prioritize(kept) == 200
    kept.close()
    for _ in range(3):
        conn = http.client.HTTPConnection("127.0.0.1", one_thread, timeout=5)
        assert prioritize(conn) == 200
        conn.close()
    assert raw(one_thread, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 200")
    assert connections_accepted(one_thread) - before == 1 + 3 + 1 + 1  # kept, 3 short, healthz, this /metrics read


def test_connections_the_client_closes_after_each_reply_are_each_closed_and_let_go(one_thread: int) -> None:
    # kube-scheduler closes the connections beyond Go's two idle ones as they come back from
    # a bind (docs/benchmarks.md): the thread waiting for such a connection's next request
    # finds it closed and the worker lets it go at once. More of them than gunicorn's
    # worker_connections (1,000): were one not let go, the worker would stop accepting.
    before = connections_accepted(one_thread)
    request = PRIORITIZE.replace(b"Host: x\r\n", b"Host: x\r\nConnection: keep-alive\r\n", 1)
    for i in range(1100):
        with socket.create_connection(("127.0.0.1", one_thread), timeout=5) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(request)
            got = b""
            while not (got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"]") and b"efficient" in got):
                chunk = s.recv(65536)
                assert chunk, (i, got)
                got += chunk
            assert b"Connection: close" not in got  # kept alive: the client is the one that closes
    assert connections_accepted(one_thread) - before == 1100 + 1  # and this /metrics read


WAIT = 0.5  # the waiting thread's NEXT_REQUEST_SECONDS in these tests: timings far apart on a busy machine


def next_request(sends: list[tuple[float, bytes | None]], monkeypatch: pytest.MonkeyPatch) -> tuple[object, SimpleNamespace, float]:
    """What the thread waiting for a connection's next request makes of ``sends`` (each after
    a pause, in seconds; None: the client closes) within WAIT: _next_request's answer, the
    connection, and how long it took. ``max_request_bytes`` is 100,000 here."""
    monkeypatch.setattr(worker_module, "NEXT_REQUEST_SECONDS", WAIT)
    worker = FrontBufferedWorker.__new__(FrontBufferedWorker)
    worker.max_body = 100_000
    worker.verb_prefix = b"/scheduler/"
    ours, theirs = socket.socketpair()

    def client() -> None:
        for pause, data in sends:
            time.sleep(pause)
            if data is None:
                theirs.close()
                return
            theirs.sendall(data)

    conn = SimpleNamespace(sock=ours, ended=False, pipelined=b"")
    sender = threading.Thread(target=client, daemon=True)
    started = time.monotonic()
    sender.start()
    try:
        found = FrontBufferedWorker._next_request(worker, conn)  # type: ignore[arg-type]
        return found, conn, time.monotonic() - started
    finally:
        sender.join()
        ours.close()
        theirs.close()


def test_a_next_request_in_pieces_within_the_wait_is_read_by_the_waiting_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # kube-scheduler's body at 1,000 names and more comes in several pieces: the thread reads
    # on while they come, instead of handing the first to the event loop.
    cut = len(PRIORITIZE) // 3
    sends = [(0.02, PRIORITIZE[:20]), (0.02, PRIORITIZE[20:cut]), (0.02, PRIORITIZE[cut:])]
    found, conn, took = next_request(sends, monkeypatch)
    assert found == ("prioritize", BODY, False) and conn.pipelined == b"" and not conn.ended
    assert took < WAIT / 2


OVER_ONE_READ = b"POST /scheduler/filter HTTP/1.1\r\nContent-Length: 300000\r\n\r\n" + b" " * 1000
OVER_MAX_BODY = b"POST /scheduler/filter HTTP/1.1\r\nContent-Length: 150000\r\n\r\n" + b" " * 1000  # within one read
EXPECTING = b"POST /scheduler/filter HTTP/1.1\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n"
NOT_A_VERB = PRIORITIZE.replace(b"/scheduler/", b"/other/")


@pytest.mark.parametrize(
    ("sends", "left", "ended", "waits"),
    [
        ([(0.0, PRIORITIZE[:-5])], PRIORITIZE[:-5], False, True),  # the rest never comes
        ([(0.0, PRIORITIZE + PRIORITIZE[:10])], PRIORITIZE + PRIORITIZE[:10], False, False),  # more than one
        ([(0.0, NOT_A_VERB)], NOT_A_VERB, False, False),
        ([(0.0, OVER_MAX_BODY)], OVER_MAX_BODY, False, False),  # the event loop's 413
        ([(0.0, OVER_ONE_READ)], OVER_ONE_READ, False, False),  # read under the event loop's budget
        ([(0.0, EXPECTING)], EXPECTING, False, False),  # the event loop sends 100 Continue
        ([(0.0, None)], b"", True, False),  # closed by the client
        ([(0.0, PRIORITIZE[:30]), (0.0, None)], PRIORITIZE[:30], False, False),  # closed mid-request
    ],
    ids=["rest-never-comes", "two-at-once", "not-a-verb", "over-max-body", "over-one-read", "expect-100-continue",
         "closed", "closed-mid-request"],
)
def test_a_next_request_the_thread_does_not_answer_goes_to_the_event_loop_with_every_byte(sends, left, ended, waits, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    found, conn, took = next_request(sends, monkeypatch)
    assert found is None and bytes(conn.pipelined) == left and conn.ended is ended
    if waits:  # for the rest, that long and no longer
        assert WAIT <= took < 1.5 * WAIT
    else:  # nothing to wait for
        assert took < WAIT / 2


def test_a_client_trickling_its_next_request_holds_the_waiting_thread_no_longer_than_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    found, conn, took = next_request([(0.0, PRIORITIZE[:10])] + [(0.1, PRIORITIZE[i : i + 1]) for i in range(10, 20)], monkeypatch)
    assert found is None and bytes(conn.pipelined).startswith(PRIORITIZE[:10])
    assert WAIT <= took < 1.5 * WAIT


def test_direct_verb_recognition() -> None:
    prefix = b"/scheduler/"
    assert _direct_verb(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\n\r\n", prefix) == ("filter", False)
    assert _direct_verb(b"POST /scheduler/bind HTTP/1.1\r\nconnection:  Close\r\n\r\n", prefix) == ("bind", True)
    for head in (
        b"POST /scheduler/filter HTTP/1.0\r\n\r\n",
        b"GET /scheduler/filter HTTP/1.1\r\n\r\n",
        b"POST /scheduler/filter?x HTTP/1.1\r\n\r\n",
        b"POST /scheduler/a/b HTTP/1.1\r\n\r\n",
        b"POST /scheduler/ HTTP/1.1\r\n\r\n",
        b"POST /other/filter HTTP/1.1\r\n\r\n",
        b"POST  /scheduler/filter HTTP/1.1\r\n\r\n",
    ):
        assert _direct_verb(head, prefix) == (None, False), head


def test_body_length_rules() -> None:
    assert _body_length(b"POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\n") == (12, None)
    assert _body_length(b"POST / HTTP/1.1\r\nHost: x\r\n\r\n") == (0, None)
    assert _body_length(b"POST / HTTP/1.1\r\ncontent-length: 1\r\nContent-Length: 1\r\n\r\n") == (None, None)
    assert _body_length(b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n") == (None, None)
    assert _body_length(b"POST / HTTP/1.1\r\nContent-Length: " + b"9" * 4300 + b"\r\n\r\n")[0] == 10**18
    # Leading zeros: the number gunicorn's parser reads too (int("000...0100") is 100) ...
    assert _body_length(b"POST / HTTP/1.1\r\nContent-Length: " + b"0" * 4297 + b"100\r\n\r\n") == (100, None)
    # ... up to int()'s 4,300 digits; past them gunicorn's parser refuses the header, and so
    # it is left to it.
    for digits in (b"0" * 4298 + b"100", b"9" * 4301):
        assert _body_length(b"POST / HTTP/1.1\r\nContent-Length: " + digits + b"\r\n\r\n") == (None, None)
    assert _body_length(b"POST / HTTP/1.1\r\nContent-Length: 0000\r\n\r\n") == (0, None)
    assert _body_length(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")[1][0] == 411  # type: ignore[index]


def test_front_body_reads() -> None:
    data = b"line one\nline two\nrest"
    body = FrontBody(data)
    assert body.read(4) == b"line" and body.readline() == b" one\n" and body.readlines() == [b"line two\n", b"rest"]
    whole = FrontBody(data)
    assert whole.read(10_000) is data and whole.read() == b""


def test_bodies_past_two_max_request_bytes_at_once_get_503(tmp_path: Path) -> None:
    proc, port = start(tmp_path, {"workers": 1, "threads": 1}, max_request_bytes=1024)
    try:
        body = BODY + b" " * (1024 - len(BODY))  # JSON with trailing blanks: exactly the limit
        head = b"POST /scheduler/prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: 1024\r\n\r\n"
        first = socket.create_connection(("127.0.0.1", port), timeout=10)
        first.sendall(head + body[:1000])  # held: 24 bytes short
        time.sleep(0.3)
        reply = raw(port, head + body[:1000])  # the second pushes the worker past 2 x 1024
        assert reply.startswith(b"HTTP/1.1 503 ") and "retry" in orjson.loads(reply.partition(b"\r\n\r\n")[2])["Error"]
        first.sendall(body[1000:])
        got = b""
        while b"efficient" not in got:
            got += first.recv(65536)
        assert got.startswith(b"HTTP/1.1 200 ")
        first.close()
    finally:
        stop(proc)


def test_past_the_budget_the_connection_holding_the_most_goes_not_the_one_that_crossed(tmp_path: Path) -> None:
    # Two clients send most of a max_request_bytes body each and stall: the worker holds
    # nearly 2 x max_request_bytes for them. A small prioritize (kube-scheduler's) takes the
    # worker past its budget; the stalled client holding the most is refused, not it.
    proc, port = start(tmp_path, {"workers": 1, "threads": 1, "request_timeout_seconds": 10}, max_request_bytes=1024)
    head = b"POST /scheduler/prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: 1024\r\n\r\n"
    stalled = []
    try:
        for sent in (860, 880):  # 1,880 bytes with their heads, of 2,048
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(head + b" " * sent)
            stalled.append(s)
        time.sleep(0.3)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        assert prioritize(conn) == 200
        conn.close()
        reply = b""
        while chunk := stalled[1].recv(65536):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 503 ") and "retry" in orjson.loads(reply.partition(b"\r\n\r\n")[2])["Error"]
        stalled[0].settimeout(0.3)
        with pytest.raises(TimeoutError):
            stalled[0].recv(1)  # still being read
    finally:
        for s in stalled:
            s.close()
        stop(proc)


def test_a_body_handed_on_with_its_connection_leaves_the_budget_at_the_hand_over(tmp_path: Path) -> None:
    # A prioritize of max_request_bytes, and the pod's bind right after it on the same
    # connection: the decision's thread reads the bind and hands the connection to the bind
    # threads, where the binding waits on an API server that never answers. The prioritize's
    # body is answered: it leaves the worker's budget (2 x max_request_bytes) at the hand-over,
    # not when the bind ends, so another client's request of max_request_bytes is read.
    api = HeldApiServer()
    kubeconfig = api_kubeconfig(tmp_path, api.listener.getsockname()[1])
    proc, port = start(
        tmp_path, {"workers": 1, "threads": 1}, max_request_bytes=1024, kubeconfig=kubeconfig,
        bind={"enabled": True, "threads": 1, "wait_seconds": 0},
    )
    body = BODY + b" " * (1024 - len(BODY))  # JSON with trailing blanks: exactly the limit
    full = b"POST /scheduler/prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: 1024\r\n\r\n" + body
    try:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as first:
                first.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                first.sendall(full)
                got = b""
                while b"efficient" not in got:
                    got += first.recv(65536)
                first.sendall(BIND)  # at once: the decision's thread is still waiting for it
                deadline = time.monotonic() + 3
                while metric(port, "joulesched_extender_binds_in_flight") < 1 and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert metric(port, "joulesched_extender_binds_in_flight") == 1
                reply = raw(port, full.replace(b"Host: x", b"Host: x\r\nConnection: close"))
                assert reply.startswith(b"HTTP/1.1 200 ") and b"efficient" in reply, reply[:300]
            api.release()  # the binding fails at once: the bind thread is free for the next round
            while metric(port, "joulesched_extender_binds_in_flight") > 0:
                time.sleep(0.02)
            api.released.clear()
    finally:
        stop(proc)
        api.close()

