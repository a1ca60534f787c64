"""extender/kube.py: ``ListWatch`` lists again at once after a 410 Gone (``WatchExpired``: "list
again, now"), however soon the watch got it, and with the back-off when 410s repeat.

Before, a run that lasted under ``HELD_SECONDS`` waited the back-off whatever ended it, a 410
included: a watch whose listing's resourceVersion had expired (etcd compacted it) stayed a
second or more behind, its bindings unseen. On a fake clock, and through the kubernetes client
against a fake API server that answers each watch as scripted.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from joulesched.extender.kube import ListWatch, PodBindingWatch, WatchExpired
from joulesched.extender.predicted import PredictedLoad
from tests.extender.test_watch_events import ScriptedWatch

GONE = WatchExpired("watch: the API answered 410 Expired: too old resource version")
CUT = ConnectionResetError("connection reset by peer")


def gaps(runs: list[tuple[float, Exception | None]]) -> list[float]:
    watch = ScriptedWatch(runs)
    watch._run()
    return [round(b - a, 3) for a, b in itertools.pairwise(watch.starts)]


def test_a_410_however_soon_it_came_lists_again_at_once() -> None:
    assert ListWatch.EXPIRED_REPEAT_SECONDS == 60.0
    assert gaps([(0.0, GONE), (2.0, None)]) == [0.0]
    assert gaps([(0.0, CUT), (0.0, CUT), (0.5, GONE), (0.0, CUT)]) == [1, 2, 0.5]  # the back-off is left where it was: 4 s next
    assert gaps([(0.0, CUT), (0.0, CUT), (0.5, GONE), (0.0, CUT), (0.0, None)]) == [1, 2, 0.5, 4]


def test_410s_that_repeat_within_EXPIRED_REPEAT_SECONDS_wait_the_back_off() -> None:
    # An API server that answers 410 to every watch: at once the first time, then the back-off
    # (1, 2, 4 … s); once the last 410 listed again at once is a minute old, at once again.
    assert gaps([(0.0, GONE)] * 10) == [0, 1, 2, 4, 8, 16, 32, 0, 60]
    # A 410 that ended a run that held counts too: the next 410, soon after, waits.
    assert gaps([(40.0, GONE), (0.0, GONE), (0.0, GONE), (0.0, None)]) == [40, 1, 2]
    # Runs of 5 s (each waits the back-off): the 410 that ends at 40 s, 40 s after the last one
    # listed again at once, waits 16 s; the one at 93 s lists at once, the back-off left at 60.
    runs = [(0.0, GONE), *[(5.0, CUT)] * 4, (5.0, GONE), (5.0, CUT), (0.0, GONE), (0.0, CUT), (0.0, None)]
    assert gaps(runs) == [0, 6, 7, 9, 13, 21, 37, 0, 60]


BOUND = {"metadata": {"name": "p", "namespace": "n", "uid": "u1", "resourceVersion": "9"},
         "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}
EVENTS: dict[str, Any] = {
    "added": {"type": "ADDED", "object": BOUND},
    "bookmark": {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "12"}}},
    "garbage": "not an event",
}


class FakeApi:
    """A fake kube-apiserver for the pod watch: ``GET /api/v1/pods`` lists (no pods, one
    resourceVersion) and, with ``watch=true``, answers the next of ``watches`` — ``"gone"``
    (the ERROR event of a 410) or ``"hold"`` (an open watch with no events until closed)."""

    def __init__(self, watches: list[str]) -> None:
        self.watches = watches
        self.lists: list[float] = []
        self.watched: list[tuple[float, str]] = []
        self.closing = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                assert url.path == "/api/v1/pods" and query.get("fieldSelector") == ["spec.nodeName!="], self.path
                if query.get("watch") != ["true"]:
                    api.lists.append(time.monotonic())
                    self._reply(json.dumps({"kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": []}).encode())
                    return
                what = api.watches.pop(0) if api.watches else "hold"
                api.watched.append((time.monotonic(), query.get("resourceVersion", [""])[0]))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if what == "gone":
                    event = json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                                                    "message": "too old resource version: 7 (12)"}}).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                elif what in EVENTS:  # one event, then the watch's end, as at its timeoutSeconds
                    event = json.dumps(EVENTS[what]).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                else:
                    api.closing.wait(30)
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True

            def _reply(self, data: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def kubeconfig(self, path: Path) -> str:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": f"http://127.0.0.1:{self.httpd.server_address[1]}"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        }))
        return str(path)

    def close(self) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(autouse=True)
def no_proxy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def watching(tmp_path: Path) -> Iterator[Any]:
    made: list[tuple[FakeApi, PodBindingWatch]] = []

    def start(watches: list[str]) -> FakeApi:
        api = FakeApi(watches)
        watch = PodBindingWatch(api.kubeconfig(tmp_path / "kubeconfig"), PredictedLoad(300, 30))
        made.append((api, watch))
        watch.start()
        return api

    yield start
    for api, watch in made:
        watch.stop()
        api.close()
        watch._thread.join(10)


def wait_for(check: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_pod_watch_lists_again_at_once_after_a_410_from_the_api_server(watching: Any) -> None:
    api = watching(["gone", "hold"])
    wait_for(lambda: len(api.watched) == 2, 10)
    assert len(api.lists) == 2 and [rv for _, rv in api.watched] == ["7", "7"]
    assert api.lists[1] - api.watched[0][0] < 0.5  # at once, not after the 1 s back-off
    time.sleep(1.2)
    assert len(api.lists) == 2  # the second watch holds: no other listing


def test_the_pod_watch_backs_off_when_the_api_server_answers_410_again_and_again(watching: Any) -> None:
    api = watching(["gone", "gone", "gone", "hold"])
    wait_for(lambda: len(api.watched) == 4, 15)
    assert len(api.lists) == 4
    waited = [round(b - a, 1) for a, b in itertools.pairwise(api.lists)]
    assert waited[0] < 0.5 and 0.9 <= waited[1] < 1.5 and 1.9 <= waited[2] < 2.5, waited


def test_a_watch_the_api_server_ends_is_followed_by_one_from_its_last_resource_version_without_a_listing(
        watching: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # As client-go's reflector: the next watch starts from the last event's resourceVersion, or
    # a BOOKMARK's. A watch that fails lists again.
    monkeypatch.setattr(ListWatch, "HELD_SECONDS", 0.0)  # these watches end at once: no back-off
    api = watching(["added", "bookmark", "garbage", "hold"])
    wait_for(lambda: len(api.watched) == 4, 10)
    assert [rv for _, rv in api.watched] == ["7", "9", "12", "7"]
    assert len(api.lists) == 2 and api.watched[2][0] < api.lists[1] < api.watched[3][0]  # after the failure only
