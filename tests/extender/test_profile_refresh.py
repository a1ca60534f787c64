"""The profile refresh ends in time against a trickling Prometheus, and staleness is reported."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest
import yaml

from joulesched.contracts import names as m
from joulesched.extender.profiles import PrometheusSource
from tests.extender.support import PROFILES
from tests.support import Clock


def answer(now: float) -> dict[str, Any]:
    def sample(name: str, value: float, **labels: str) -> dict[str, Any]:
        return {"metric": {"__name__": name, "node": "a", **labels}, "value": [now, str(value)]}

    return {
        "values": [
            sample(m.NODE_CPU_CORES.name, 64),
            sample(m.NODE_CPU_UTILISATION.name, 0.25),
            sample(m.MODEL_IDLE.name, 60, device="cpu"),
            sample(m.MODEL_PER_CORE.name, 3, device="cpu"),
        ],
        "measured": [{"metric": {"node": "a"}, "value": [now, str(now)]}],
    }


class FakePrometheus:
    """``/api/v1/query`` that trickles (headers, then a byte a second) until ``healthy`` is set."""

    def __init__(self) -> None:
        self.healthy = threading.Event()
        self.stop = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)["query"][0]
                if not outer.healthy.is_set():
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    try:
                        while not outer.stop.wait(0.2):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                    except OSError:
                        pass
                    return
                kind = "measured" if "timestamp(" in query else "values"
                body = orjson.dumps(
                    {"status": "success", "data": {"resultType": "vector", "result": answer(time.time())[kind]}}
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    server = FakePrometheus()
    yield server
    server.close()


def test_a_trickling_prometheus_cannot_wedge_the_refresh(prometheus: FakePrometheus) -> None:
    source = PrometheusSource(prometheus.url, cache_seconds=0.2, timeout_seconds=0.5)
    started = time.monotonic()
    snap = source.snapshot()  # the first load waits, for the deadline at most
    assert time.monotonic() - started < 3.0
    assert not snap.ready and "no complete answer within 0.5 s" in snap.error and source.errors == 1
    for _ in range(3):  # background refreshes, each ending at its deadline
        time.sleep(0.8)
        source.snapshot()
    time.sleep(0.8)
    assert source.errors >= 3
    prometheus.healthy.set()
    deadline = time.monotonic() + 10
    while not source.snapshot().ready:
        assert time.monotonic() < deadline, "the refresh never reached the healthy Prometheus"
        time.sleep(0.1)
    snap = source.snapshot()
    assert [p.name for p in snap.profiles.nodes] == ["a"] and not snap.error


def test_an_unreachable_or_wrong_prometheus_is_an_error_not_a_hang() -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    port = srv.server_address[1]
    srv.server_close()  # nothing listens there now
    source = PrometheusSource(f"http://127.0.0.1:{port}", timeout_seconds=0.5)
    snap = source.snapshot()
    assert not snap.ready and "refused" in snap.error.lower()


def profile_doc(updated: list[float]) -> dict[str, Any]:
    doc = {**PROFILES, "nodes": [dict(n) for n in PROFILES["nodes"]]}
    for node, at in zip(doc["nodes"], updated, strict=False):
        node["updated"] = at
    return doc


@pytest.mark.parametrize(
    ("ages", "status", "stale"),
    [([10, 20, 30], 200, 0), ([500, 20, 600], 200, 2), ([500, 700, 600], 503, 3)],
)
def test_readyz_and_the_gauges_report_stale_profiles(
    tmp_path: Path, ages: list[float], status: int, stale: int
) -> None:
    from prometheus_client import CollectorRegistry

    from joulesched.extender.app import create_app
    from joulesched.extender.config import parse_config
    from joulesched.extender.metrics import ExtenderMetrics

    clock = Clock(1_000_000.0)
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump(profile_doc([clock.now - a for a in ages])))
    config = parse_config(
        {"profiles": {"file": {"path": str(tmp_path / "nodes.yaml")}}, "policy": {"max_age_seconds": 120}}, "test"
    )
    metrics = ExtenderMetrics(CollectorRegistry())
    app = create_app(config, metrics=metrics, clock=clock, background=False)
    reply = app.test_client().get("/readyz")
    assert reply.status_code == status
    assert f"3 node profiles from file, {stale} stale (measured over 120 s ago)" in reply.data.decode()
    app.extensions["joulesched"]["gauges"].write_once()  # the gauge writer's tick, with no request
    text = app.test_client().get("/metrics").data.decode()
    assert f'joulesched_extender_profiles{{state="stale"}} {stale}.0' in text
    assert f'joulesched_extender_profiles{{state="fresh"}} {3 - stale}.0' in text
