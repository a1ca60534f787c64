"""The agent's HTTP API against a replica node: metrics, health, profile, windows, security."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from joulesched.measurement.exporters.prometheus import make_registry
from joulesched.measurement.server import AgentServer, _Handler
from joulesched.policy.profile import parse_profiles
from tests.measurement.agent_server_support import POD, Running, start
from tests.measurement.fakes import FakeClock


def test_metrics_health_and_profile(running: Running) -> None:
    status, body, _ = running.request("GET", "/healthz")
    assert status == 503 and "no sample yet" in body["error"]
    running.agent.step()
    assert running.request("GET", "/healthz")[0] == 200
    status, doc, _ = running.request("GET", "/v1/profile")
    assert status == 503 and "no power model yet" in doc["error"]
    for cores in (0.0, 1.0, 2.0, 3.0, 0.5):
        running.step(busy_cores=cores)
    status, text, headers = running.request("GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert 'joulesched_node_energy_joules_total{node="node-a",source="rapl_sysfs",zone="package-0"}' in text
    assert (
        'joulesched_pod_energy_joules_total{domain="cpu",idle_policy="requests",namespace="",node="node-a",pod="'
        + POD
        + '"}'
        in text
    )
    status, doc, _ = running.request("GET", "/v1/profile")
    assert status == 200
    node = parse_profiles(doc, "GET /v1/profile").nodes[0]
    assert node.name == "node-a" and node.cores == 4
    assert node.power_curve_watts[0] == pytest.approx(105.0)  # 100 W package + 5 W DRAM at idle
    assert node.power_curve_watts[-1] == pytest.approx(105.0 + 10 * 4)
    running.clock.tick(60)
    status, body, _ = running.request("GET", "/healthz")
    assert status == 503 and "last sample" in body["error"]


def test_unknown_endpoint_and_bad_body(running: Running) -> None:
    assert running.request("GET", "/nope")[0] == 404
    req = urllib.request.Request(running.url + "/v1/windows", data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    err.value.close()
    assert err.value.code == 400
    assert running.request("DELETE", "/v1/windows/doesnotexist")[0] == 404


def test_window_reads_counters_at_its_edges(running: Running) -> None:
    running.agent.step()
    status, opened, headers = running.request("POST", "/v1/windows", {"label": "nextflow run main.nf"})
    assert status == 201 and headers["Location"] == f"/v1/windows/{opened['id']}"
    running.powercap.advance("intel-rapl:0", 1234.5)  # no sample in between: only the edges count
    running.powercap.advance("intel-rapl:0:1", 100.25)
    running.clock.tick(0.4)
    status, body, _ = running.request("DELETE", f"/v1/windows/{opened['id']}")
    assert status == 409 and "at least 1 s" in body["error"]  # unauthenticated: no sub-second windows
    running.clock.tick(0.8)
    running.powercap.advance("intel-rapl:0", 0.5)
    status, result, _ = running.request("DELETE", f"/v1/windows/{opened['id']}")
    assert status == 200
    assert result["label"] == "nextflow run main.nf"
    assert result["seconds"] == pytest.approx(1.2)
    assert result["joules"]["cpu"] == pytest.approx(1235.0, abs=1e-6)
    assert result["joules"]["dram"] == pytest.approx(100.25, abs=1e-6)
    assert result["kilojoules"]["node"] == pytest.approx(1.33525, abs=1e-9)
    assert result["sources"] == ["rapl_sysfs"]
    assert running.request("DELETE", f"/v1/windows/{opened['id']}")[0] == 404


def test_token_is_required_when_configured(with_token: Running) -> None:
    with_token.agent.step()
    status, _, headers = with_token.request("POST", "/v1/windows")
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
    assert with_token.request("POST", "/v1/windows", token="wrong")[0] == 401
    status, opened, _ = with_token.request("POST", "/v1/windows", token="s3cret")
    assert status == 201
    with_token.powercap.advance("intel-rapl:0", 2.0)
    with_token.clock.tick(0.05)  # authenticated clients may close sub-second windows
    status, result, _ = with_token.request("DELETE", f"/v1/windows/{opened['id']}", token="s3cret")
    assert status == 200 and result["joules"]["cpu"] == pytest.approx(2.0)
    assert with_token.request("GET", "/metrics")[0] == 200  # metrics stay public


def test_windows_are_refused_off_loopback_without_a_token(running: Running) -> None:
    agent = running.agent
    server = AgentServer(
        ("127.0.0.1", 0),
        sampler=agent.sampler,
        published=agent.latest_published,
        registry=make_registry(agent.latest_published),
        token=None,
        windows_allowed=False,  # what build_server decides for 0.0.0.0 without token_file
        min_samples=4,
        stale_after=5.0,
        clock=running.clock,
    )
    server.serve_in_thread()
    try:
        host, port = server.server_address[:2]
        req = urllib.request.Request(f"http://{host}:{port}/v1/windows", data=b"", method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        with err.value:
            assert err.value.code == 403
            assert "server.token_file" in json.loads(err.value.read())["error"]
    finally:
        server.shutdown()
        server.server_close()


def test_metrics_are_published_at_most_once_a_second(tmp_path: Path, clock: FakeClock) -> None:
    r = start(tmp_path, clock, interval=0.1)
    try:
        r.agent.step()
        first = r.agent.published
        assert first is not None
        for _ in range(9):
            r.step(seconds=0.1)
            assert r.agent.published is first  # sampled, not published
        r.step(seconds=0.1)
        assert r.agent.published is not first and r.agent.published.time - first.time == pytest.approx(1.0)
    finally:
        r.server.shutdown()
        r.server.server_close()


def test_connections_use_tcp_nodelay() -> None:
    assert _Handler.disable_nagle_algorithm is True
