"""Reading a watch response (extender/kube.py: ``watch_events``): kube-apiserver's one JSON event
a line, however the lines fall into chunks; anything else is refused by name, never skipped."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import urllib3

from joulesched.extender.errors import ExtenderError
from joulesched.extender.kube import (
    MAX_WATCH_LINE_BYTES,
    WATCH_READ_GRACE_SECONDS,
    WATCH_SECONDS,
    ListWatch,
    WatchExpired,
    watch_events,
)


class Response:
    """urllib3's HTTPResponse as the generated client returns it with ``_preload_content=False``."""

    def __init__(self, chunks: list[bytes], chunked: bool = True) -> None:
        self.chunks = chunks
        self.chunked = chunked
        self.closed = False

    def read_chunked(self, decode_content: bool = True) -> Iterator[bytes]:
        assert self.chunked and decode_content
        yield from self.chunks

    def read1(self, amt: int, decode_content: bool = True) -> bytes:
        """What has arrived, at most ``amt`` bytes; b"" at the end."""
        assert not self.chunked and decode_content
        return self.chunks.pop(0)[:amt] if self.chunks else b""

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        assert self.closed  # after close: the connection goes back to no pool half-read


def event(kind: str, name: str) -> bytes:
    return orjson.dumps({"type": kind, "object": {"metadata": {"name": name, "resourceVersion": "7"}}}) + b"\n"


def lister(resp: Response, seen: dict[str, Any]) -> Any:
    def list_call(**params: Any) -> Response:
        seen.update(params)
        return resp

    return list_call


def names(resp: Response) -> list[tuple[str, str]]:
    return [(kind, obj["metadata"]["name"]) for kind, obj in watch_events(lister(resp, {}))]


def test_one_event_a_chunk_as_kube_apiserver_sends_them() -> None:
    resp = Response([event("ADDED", "a"), event("MODIFIED", "a"), event("DELETED", "a")])
    assert names(resp) == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert resp.closed


@pytest.mark.parametrize("chunked", [True, False])
def test_lines_split_and_joined_across_chunks(chunked: bool) -> None:
    stream = event("ADDED", "a") + event("ADDED", "b") + event("MODIFIED", "c")
    pieces = [stream[:5], stream[5:70], stream[70:71], stream[71:]]
    assert names(Response(pieces, chunked)) == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "c")]


def test_a_last_line_without_its_newline_and_blank_lines() -> None:
    resp = Response([b"\n", event("ADDED", "a"), b"\n\n", event("DELETED", "a").rstrip(b"\n")])
    assert names(resp) == [("ADDED", "a"), ("DELETED", "a")]


@pytest.mark.parametrize("chunked", [True, False])
def test_a_line_that_never_ends_is_refused_once_past_the_limit_not_buffered_for_ever(chunked: bool) -> None:
    """A server (or a proxy) sending bytes and no newline: the watch fails by name when the line
    passes MAX_WATCH_LINE_BYTES, and the caller lists again with back-off."""
    piece = b"x" * 65536  # what read1 returns at most
    resp = Response([event("ADDED", "a"), *(piece for _ in range(MAX_WATCH_LINE_BYTES // len(piece) + 2))], chunked)
    events = watch_events(lister(resp, {}))
    assert next(events) == ("ADDED", {"metadata": {"name": "a", "resourceVersion": "7"}})
    with pytest.raises(ExtenderError, match=f"a line over {MAX_WATCH_LINE_BYTES} bytes without its newline: b'xxx"):
        next(events)
    assert resp.closed


def test_the_watch_request() -> None:
    seen: dict[str, Any] = {}
    list(watch_events(lister(Response([]), seen), label_selector="x", resource_version="5"))
    assert seen == {
        "watch": True,
        "timeout_seconds": WATCH_SECONDS,
        "_preload_content": False,
        "_request_timeout": (30, WATCH_SECONDS + WATCH_READ_GRACE_SECONDS),
        "label_selector": "x",
        "resource_version": "5",
    }
    assert WATCH_READ_GRACE_SECONDS > 0  # the server ends a watch before the client gives up on it


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b'{"type":"ADDED","object":{"metadata"', "not JSON"),
        (b"<html>proxy error</html>", "not JSON"),
        (b'{"type":"ADDED"}', "not an event"),
        (b'{"object":{}}', "not an event"),
        (b'["ADDED",{}]', "not an event"),
        (b'{"type":"ADDED","object":"pod"}', "not an event"),
    ],
)
def test_a_line_that_is_not_an_event_is_refused_by_name(line: bytes, says: str) -> None:
    resp = Response([event("ADDED", "a"), line + b"\n", event("ADDED", "b")])
    events = watch_events(lister(resp, {}))
    assert next(events)[0] == "ADDED"
    with pytest.raises(ExtenderError, match=says) as err:
        next(events)
    assert repr(line[:20])[2:-1] in str(err.value)  # the line itself, quoted
    assert resp.closed


@pytest.mark.parametrize(
    ("code", "raised"), [(410, WatchExpired), (500, ExtenderError), (None, ExtenderError)]
)
def test_an_error_event_raises_with_the_apis_words(code: int | None, raised: type[Exception]) -> None:
    # 410 Gone: the resourceVersion expired, list again at once; anything else: back off.
    status = {"kind": "Status", "code": code, "reason": "Expired", "message": "too old resource version"}
    resp = Response([event("ADDED", "a"), orjson.dumps({"type": "ERROR", "object": status}) + b"\n"])
    events = watch_events(lister(resp, {}))
    assert next(events)[0] == "ADDED"
    with pytest.raises(raised, match="too old resource version") as err:
        next(events)
    assert (err.type is WatchExpired) is (code == 410)
    assert resp.closed


def test_the_response_is_closed_when_the_caller_stops() -> None:
    resp = Response([event("ADDED", "a"), event("ADDED", "b")])
    for _ in watch_events(lister(resp, {})):
        break
    assert resp.closed


class Core:
    """CoreV1Api's two list calls the deferrer's PodCache makes: a listing, then watches."""

    def __init__(self, watches: list[list[bytes]]) -> None:
        self.watches = watches
        self.lists = 0
        self.watched: list[tuple[float, str]] = []  # when each watch began, from which resourceVersion

    def list_pod_for_all_namespaces(self, **params: Any) -> Any:
        if not params.get("watch"):
            self.lists += 1
            return type("Listing", (), {"data": b'{"metadata":{"resourceVersion":"5"},"items":[]}'})()
        self.watched.append((time.monotonic(), params.get("resource_version", "")))
        if not self.watches:
            time.sleep(0.05)  # a quiet watch
            return Response([])
        return Response(self.watches.pop(0))


def test_the_deferrers_pod_cache_lists_and_backs_off_as_every_watch_does() -> None:
    # The deferrer's pod cache is a ListWatch: a 410 lists again at once (WatchExpired: "list
    # again, now"), a watch that ends soon after its start on an ERROR event waits the back-off
    # (1 s) before listing again, one that ends cleanly as soon waits it too (2 s) and then
    # watches again from its resourceVersion without listing, and an ERROR other than 410 is
    # named in ``error`` until a listing succeeds. Before, a watch that ended cleanly was watched
    # again at once, in a loop if it kept ending.
    from joulesched.extender.deferrer import PodCache

    gone = orjson.dumps({"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}) + b"\n"
    broken = orjson.dumps({"type": "ERROR", "object": {"code": 500, "message": "etcd unavailable"}}) + b"\n"
    cache = PodCache(None)
    core = Core([[gone], [broken]])
    cache.core = core
    started = time.monotonic()
    cache.start()
    try:
        assert cache.synced.wait(2)
        while "etcd unavailable" not in cache.error and time.monotonic() < started + 5:
            time.sleep(0.01)
        second = time.monotonic()
        assert "etcd unavailable" in cache.error and core.lists == 2
        assert second - started < 0.9  # the 410: listed again at once, no back-off
        time.sleep(0.6)
        assert core.lists == 2  # the 500: waiting its back-off (1 s)
        while core.lists < 3 and time.monotonic() < started + 8:
            time.sleep(0.01)
        assert core.lists == 3 and cache.error == ""  # listed: the error is cleared
        assert time.monotonic() - second >= 0.9
        while len(core.watched) < 4 and time.monotonic() < started + 10:
            time.sleep(0.01)
        # the quiet watch after that listing ended soon: the next waited the back-off (2 s now),
        # and resumed from the listing's resourceVersion, without listing again
        (quiet, _), (after, version) = core.watched[2], core.watched[3]
        assert after - quiet >= 1.9 and version == "5" and core.lists == 3, core.watched
    finally:
        cache.stop()


class ScriptedWatch(ListWatch):
    """A list-and-watch whose runs last and end as scripted, on a clock that only they and the
    back-off's waits move."""

    def __init__(self, runs: list[tuple[float, Exception | None]]) -> None:
        super().__init__()
        self.runs = runs  # (seconds the run lasts, what ends it: None for a clean end)
        self.now = 0.0
        self.monotonic = lambda: self.now
        self.starts: list[float] = []
        watch = self

        class Stop:
            def is_set(self) -> bool:
                return not watch.runs

            def wait(self, seconds: float) -> bool:
                watch.now += seconds
                return False

        self._stop = Stop()  # type: ignore[assignment]

    def _watch_once(self) -> None:
        lasts, ends = self.runs.pop(0)
        self.starts.append(self.now)
        self.now += lasts
        if ends is not None:
            raise ends


def test_a_watch_that_held_lists_again_at_once_and_one_that_ended_soon_waits_the_back_off() -> None:
    gone = WatchExpired("watch: the API answered 410 Expired: too old resource version")
    cut = ConnectionResetError("connection reset by peer")
    watch = ScriptedWatch([
        (0.0, cut), (0.0, cut), (0.0, None),  # failing, or ended at once: 1, 2, 4 s apart
        (300.0, None),  # then held to the API server's watch timeout: listed again at once
        (40.0, gone),  # a 410 after a watch that held: at once, as a connection cut would be
        (0.0, gone),  # one that came at once waits the back-off, from its first step again
        (700.0, cut),
        *[(0.0, cut)] * 8,  # doubling to 60 s, no further
    ])
    watch._run()
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(watch.starts)]
    assert gaps == [1, 2, 4, 300, 40, 1, 700, 1, 2, 4, 8, 16, 32, 60], gaps


def _watch_server(script: list[tuple[float, list[bytes]]]) -> tuple[int, list[float]]:
    """A loopback server answering one GET with a chunked watch, as kube-apiserver writes one:
    for each ``(gap, chunks)`` of the script it waits ``gap`` seconds, then writes those chunks
    in one write. Returns the port and the list it fills with each write's time (monotonic)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    sent: list[float] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            for gap, chunks in script:
                time.sleep(gap)
                sent.append(time.monotonic())
                conn.sendall(b"".join(b"%x\r\n" % len(c) + c + b"\r\n" for c in chunks))
            conn.sendall(b"0\r\n\r\n")
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1], sent


def _read_watch(port: int, batch: float) -> list[tuple[str, float]]:
    """The events' names and when each was read, through urllib3 as the kubernetes client reads
    a watch (``_preload_content=False``)."""
    pool = urllib3.PoolManager()

    def list_call(**params: Any) -> Any:
        return pool.request("GET", f"http://127.0.0.1:{port}/api/v1/pods?watch=1", preload_content=False)

    try:
        return [(obj["metadata"]["name"], time.monotonic()) for _, obj in watch_events(list_call, batch_seconds=batch)]
    finally:
        pool.clear()


@pytest.mark.parametrize("batch", [0.05, 0.0])
def test_a_burst_of_events_is_read_a_batch_at_a_time_and_a_lone_event_at_once(batch: float) -> None:
    # One event, a quiet spell, one more, then 40 events 5 ms apart, each its own chunk and
    # write, as kube-apiserver sends a burst's bindings.
    port, sent = _watch_server([(0.0, [event("ADDED", "p0")]), (0.3, [event("ADDED", "p1")])]
                               + [(0.1 if i == 2 else 0.005, [event("ADDED", f"p{i}")]) for i in range(2, 41)])
    got = _read_watch(port, batch)
    assert [name for name, _ in got] == [f"p{i}" for i in range(41)]
    at = [t for _, t in got]
    wakes = 1 + sum(1 for a, b in itertools.pairwise(at) if b - a > 0.002)  # reads that found new events
    late = max(t - s for t, s in zip(at, sent, strict=True))
    if batch:
        # The lone events are read at once: before the next one is even sent (100 ms later).
        assert at[0] < sent[1] and at[1] < sent[2]
        assert wakes <= 15, f"{wakes} reads for 41 events"  # 200 ms of burst / 50 ms, the lone ones, hiccups
        assert late < batch + 0.25, f"an event read {late:.3f} s after it was sent"
    else:
        assert wakes >= 25, f"{wakes} reads for 41 events"  # one an event, but for the machine's hiccups


def test_events_that_arrive_together_wait_one_batch_at_most() -> None:
    # Twenty small events in one write: all in http.client's buffer after its first read, and
    # read then, not a batch each (which would take a second), well before the next write.
    port, sent = _watch_server([(0.0, [event("ADDED", f"e{i}") for i in range(20)]), (1.0, [event("ADDED", "late")])])
    got = _read_watch(port, 0.05)
    assert [name for name, _ in got] == [f"e{i}" for i in range(20)] + ["late"]
    together = max(t for name, t in got if name != "late") - sent[0]
    assert together < 0.05 + 0.15, f"twenty events read over {together:.3f} s"


def test_an_event_cut_in_two_is_read_once_whole_without_a_batch() -> None:
    # After a lone event and a quiet spell, an event cut into two chunks 1 ms apart: read as
    # soon as its end comes, not a batch later.
    line = event("ADDED", "cut")
    port, sent = _watch_server([(0.0, [event("ADDED", "lone")]), (0.3, [line[:40]]), (0.001, [line[40:]])])
    got = _read_watch(port, 0.05)
    assert [name for name, _ in got] == ["lone", "cut"]
    assert got[1][1] - sent[2] < 0.04, f"the cut event read {got[1][1] - sent[2]:.3f} s after its end was sent"
