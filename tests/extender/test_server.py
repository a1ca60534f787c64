"""The real server: ``joulesched extender`` under gunicorn, driven as kube-scheduler drives it."""

from __future__ import annotations

import http.client
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml

from joulesched.extender.demo import free_port, stop, wait_ready
from tests.extender.support import PROFILES, make_pod


@pytest.fixture
def server(tmp_path: Path) -> Iterator[int]:
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump(PROFILES))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"profiles": {"file": {"path": "nodes.yaml"}}, "server": {"workers": 2}}))
    port = free_port()
    log = (tmp_path / "extender.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "joulesched", "extender", "--config", str(tmp_path / "config.yaml"), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        wait_ready(port, proc)
        yield port
    finally:
        log.close()
        stop(proc)


def test_one_kept_alive_connection_serves_many_requests_without_delayed_ack_stalls(server: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=5)
    body = orjson.dumps({"Pod": make_pod(), "NodeNames": ["efficient", "hungry", "capped"]})
    conn.connect()
    sock = conn.sock
    latencies = []
    for _ in range(60):
        started = time.perf_counter()
        conn.request("POST", "/scheduler/prioritize", body, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        data = reply.read()
        latencies.append(time.perf_counter() - started)
        assert reply.status == 200 and orjson.loads(data)[0]["Host"] == "efficient"
        assert conn.sock is sock, "the server closed the kept-alive connection"
    conn.close()
    # A reply stalled by Nagle + delayed ACK takes ~40 ms; a healthy one ~1 ms here.
    assert statistics.median(latencies) < 0.020, f"median {statistics.median(latencies) * 1000:.1f} ms"


def test_metrics_add_up_over_all_gunicorn_workers(server: int) -> None:
    body = orjson.dumps({"Pod": make_pod(), "NodeNames": ["efficient"]})
    sent = 0
    for _ in range(8):
        conn = http.client.HTTPConnection("127.0.0.1", server, timeout=5)
        for _ in range(5):
            conn.request("POST", "/scheduler/filter", body)
            assert conn.getresponse().read()
            sent += 1
        conn.close()
    for _ in range(3):
        conn = http.client.HTTPConnection("127.0.0.1", server, timeout=5)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        match = re.search(r'joulesched_extender_requests_total\{code="200",verb="filter"\} (\S+)', text)
        assert match and float(match.group(1)) == sent


def test_cli_rejects_a_bad_config_naming_every_problem(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"policy": {"strategy": "greedy"}, "listen": "nowhere", "bogus": 1}))
    result = subprocess.run(
        [sys.executable, "-m", "joulesched", "extender", "--config", str(tmp_path / "bad.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "bad.yaml: 3 problems" in result.stderr
    assert "policy.strategy: must be one of energy, carbon, got 'greedy'" in result.stderr
    assert "listen: must be HOST:PORT" in result.stderr
    assert "bogus: unknown field" in result.stderr


def test_cli_rejects_a_broken_profile_file_before_serving(tmp_path: Path) -> None:
    (tmp_path / "nodes.yaml").write_text("nodes:\n  - {name: a, cores: 0, idle_watts: 10, watts_per_core: 1}\n")
    (tmp_path / "c.yaml").write_text("profiles: {file: {path: nodes.yaml}}\n")
    result = subprocess.run(
        [sys.executable, "-m", "joulesched", "extender", "--config", str(tmp_path / "c.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "nodes[0].cores: must be > 0, got 0" in result.stderr


def test_demo_prints_scores_from_the_real_server() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "joulesched", "extender", "--demo"], capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, result.stderr
    assert "6 node profiles from file" in result.stdout
    scores = orjson.loads(result.stdout.strip().splitlines()[-1])
    assert len(scores) == 6 and max(h["Score"] for h in scores) == 10
