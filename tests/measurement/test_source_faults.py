"""Source faults: a silent BMC stalls nothing, a failed source is retried with backoff,
every failure is visible in /metrics and /readyz, and the power gauge tells the truth.

The BMC is the Redfish mockup of tests/measurement/sources on loopback (``silent``: it takes the
request and never answers); the RAPL zones are replica powercap trees.
"""

from __future__ import annotations

import itertools
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from joulesched.measurement.agent import Agent, build_agent, build_server
from joulesched.measurement.config import AgentConfig, KubernetesConfig, ServerConfig, SourcesConfig
from joulesched.measurement.meter import EnergyMeter, Pending
from joulesched.measurement.server import AgentServer
from joulesched.measurement.sources.base import Roots, Source
from joulesched.measurement.sources.registry import open_sources
from tests.measurement.agent_server_support import Running
from tests.measurement.fakes import FakeClock, FakeSource, FakeZone
from tests.measurement.replica import PowercapTree
from tests.measurement.sources.redfish_support import REDFISH_FIXTURES, MockupServer

HPE = REDFISH_FIXTURES / "hpe-proliant-dl360-gen11-ilo6"
ENV = "/redfish/v1/Chassis/1/EnvironmentMetrics"


TOKEN = "s3cret"


def _config(
    roots: Roots, order: tuple[str, ...], options: dict[str, dict[str, object]], token_file: str = "", **sources: object
) -> AgentConfig:
    return AgentConfig(
        node=AgentConfig().node.__class__(name="node-a"),
        roots=roots,
        sources=replace(SourcesConfig(order=order, options=options), **sources),
        kubernetes=KubernetesConfig(mode="off"),
        server=ServerConfig(listen="127.0.0.1:0", token_file=token_file),
    )


def _get(url: str, path: str, method: str = "GET") -> tuple[int, str, float]:
    """One request on a fresh connection: status, body, seconds it took."""
    import urllib.error
    import urllib.request

    started = time.perf_counter()
    req = urllib.request.Request(url + path, data=b"{}" if method == "POST" else None, method=method)
    req.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            body, status = response.read().decode(), response.status
    except urllib.error.HTTPError as err:
        with err:
            body, status = err.read().decode(), err.code
    return status, body, time.perf_counter() - started


@pytest.fixture
def serving() -> Iterator[list[tuple[Agent, AgentServer]]]:
    started: list[tuple[Agent, AgentServer]] = []
    yield started
    for agent, server in started:
        agent.stop()
        server.shutdown()
        server.server_close()


# -- 1. a silent BMC delays neither the other sources nor HTTP -----------------------------------


def test_a_silent_bmc_delays_neither_rapl_nor_any_http_endpoint(
    tmp_path: Path, roots: Roots, powercap: PowercapTree, serving: list[tuple[Agent, AgentServer]]
) -> None:
    powercap.add("intel-rapl:0", "package-0")
    (tmp_path / "token").write_text(TOKEN)
    with MockupServer(HPE) as bmc:
        options = {"redfish": {"url": bmc.url, "timeout_s": 3.0}}
        config = _config(
            roots,
            ("rapl_sysfs", "redfish"),
            options,
            str(tmp_path / "token"),
            retry_initial_seconds=0.2,
            retry_max_seconds=0.5,
        )
        agent = build_agent(config)
        server = build_server(agent)
        serving.append((agent, server))
        server.serve_in_thread()
        url = "http://{}:{}".format(*server.server_address[:2])
        agent.sampler.meter.start(0.5)  # the wait a loaded machine needs to schedule the RAPL reader (default 50 ms)
        agent.step()

        bmc.silent.set()  # from now on every GET hangs (3 s client timeout)
        slowest_sample = slowest_http = 0.0
        rapl_before = None
        deadline = time.monotonic() + 4.5  # longer than one BMC timeout
        while time.monotonic() < deadline:
            powercap.advance("intel-rapl:0", 10.0)
            started = time.perf_counter()
            snap = agent.step()
            slowest_sample = max(slowest_sample, time.perf_counter() - started)
            rapl = next(z.joules_total for z in snap.zones if z.zone == "package-0")
            if rapl_before is not None:
                assert rapl == pytest.approx(rapl_before + 10.0), "RAPL was read in this sample"
            rapl_before = rapl
            for method, path in (("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics"), ("POST", "/v1/windows")):
                status, body, seconds = _get(url, path, method)
                slowest_http = max(slowest_http, seconds)
                assert status in (200, 201), (path, status, body)
                if path == "/v1/windows":
                    window = json.loads(body)["id"]
                    status, body, seconds = _get(url, f"/v1/windows/{window}", "DELETE")
                    slowest_http = max(slowest_http, seconds)
                    assert status == 200, body
            time.sleep(0.2)
        # A read that waited for the BMC would take its 3 s timeout; 1 s leaves room for a loaded machine.
        assert slowest_sample < 1.0, slowest_sample
        assert slowest_http < 1.0, slowest_http
        health = {s.name: s for s in agent.sampler.meter.source_snapshots()}
        assert not health["redfish"].up and "no answer within 3 s" in health["redfish"].error
        assert health["rapl_sysfs"].up

        bmc.silent.clear()  # it answers again: read again within one backoff period (+ one timeout)
        deadline = time.monotonic() + 8.0
        while not agent.sampler.meter.usable() or not health["redfish"].up:
            assert time.monotonic() < deadline, "redfish did not come back"
            time.sleep(0.1)
            agent.step()
            health = {s.name: s for s in agent.sampler.meter.source_snapshots()}


def test_a_reader_that_hangs_is_not_waited_for_longer_than_the_wait(clock: FakeClock) -> None:
    """Unit level: read() returns within its wait while one source's read blocks."""
    release = threading.Event()

    class Hanging(FakeZone):
        def read(self):  # type: ignore[no-untyped-def]
            release.wait(30)
            return super().read()

    fast = FakeSource("rapl_sysfs", [FakeZone("package-0", "package", "counter", clock, max_joules=1e6)])
    slow = FakeSource("ipmi_dcmi", [Hanging("platform", "platform", "power", clock, 200.0)])
    meter = EnergyMeter([fast, slow], clock=clock)
    meter.start(0.05)
    try:
        meter.read()
        clock.tick()
        fast.zone_list[0].value = 50.0
        started = time.perf_counter()
        totals = meter.read(wait=0.5).totals  # longer than the default 50 ms: a loaded machine schedules late
        assert time.perf_counter() - started < 1.0
        assert totals[("rapl_sysfs", "package-0")] == 50 * 10**9
        assert totals[("ipmi_dcmi", "platform")] == 0
    finally:
        release.set()
        meter.stop()


# -- 2. failed at start: retried with backoff, visible in metrics and readiness --------------------


def test_a_source_that_failed_at_start_is_retried_with_backoff_until_it_opens(
    tmp_path: Path, roots: Roots, clock: FakeClock, serving: list[tuple[Agent, AgentServer]]
) -> None:
    password = tmp_path / "password"
    password.write_text("wrong\n")
    with MockupServer(HPE, credentials=("monitor", "right")) as bmc:
        options = {"redfish": {"url": bmc.url, "username": "monitor", "password_file": str(password)}}
        config = _config(roots, ("redfish",), options, retry_initial_seconds=1.0, retry_max_seconds=30.0)
        agent = build_agent(config, clock=clock)
        server = build_server(agent)
        serving.append((agent, server))
        server.serve_in_thread()
        url = "http://{}:{}".format(*server.server_address[:2])
        agent.step()
        status, body, _ = _get(url, "/readyz")
        assert status == 503
        assert "no usable energy source" in json.loads(body)["error"] and "HTTP 401" in body
        assert _get(url, "/healthz")[0] == 200, "liveness is not readiness"
        metrics = _get(url, "/metrics")[1]
        assert 'joulesched_source_up{source="redfish"} 0.0' in metrics
        assert 'joulesched_source_error_info{error="redfish (' in metrics and "HTTP 401 Unauthorized" in metrics

        # wrong for 120 s of samples: tried with a doubling wait, not every second
        attempts = bmc.requests.count("/redfish/v1/Chassis")
        for _ in range(120):
            clock.tick()
            agent.step()
        tries = bmc.requests.count("/redfish/v1/Chassis") - attempts
        assert 5 <= tries <= 12, tries  # 1, 2, 4, 8, 16, 30, 30, 30 s (each 50..100 %): not 120

        password.write_text("right\n")
        for _ in range(31):  # the longest wait is 30 s
            clock.tick()
            agent.step()
            if agent.sampler.meter.usable():
                break
        assert agent.sampler.meter.usable(), agent.sampler.meter.source_snapshots()
        status, body, _ = _get(url, "/readyz")
        assert status == 200, body
        bmc.overrides[ENV] = {"PowerWatts": {"Reading": 400.0}, "EnergykWh": {"Reading": 1523.418}}
        clock.tick()
        snap = agent.step()
        assert {z.zone: z.joules_total for z in snap.zones}["chassis-1"] == pytest.approx(3600.0)
        agent.published = snap
        metrics = _get(url, "/metrics")[1]
        assert 'joulesched_source_up{source="redfish"} 1.0' in metrics
        assert "joulesched_source_error_info{" not in metrics


def test_backoff_doubles_with_jitter_up_to_its_cap_and_resets_on_success(clock: FakeClock) -> None:
    tries: list[float] = []
    broken = True

    def opener() -> Source:
        tries.append(clock())
        if broken:
            from joulesched.measurement.errors import SourceFailed

            raise SourceFailed("ipmi_dcmi (BMC 10.0.0.5:6230): session timeout")
        return FakeSource("ipmi_dcmi", [FakeZone("platform", "platform", "power", clock, 300.0)])

    meter = EnergyMeter(
        [],
        clock=clock,
        pending=[Pending("ipmi_dcmi", opener, "ipmi_dcmi: session timeout")],
        retry_initial_seconds=1.0,
        retry_max_seconds=8.0,
        rng=random.Random(7),
    )
    start = clock()
    for _ in range(200):
        clock.tick(0.25)
        meter.read()
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert tries[0] == start + 0.25
    for i, gap in enumerate(gaps[:6]):
        nominal = min(8.0, 2.0**i)
        assert 0.5 * nominal - 0.25 <= gap <= nominal + 0.25, (i, gaps)
    assert max(gaps) <= 8.25 and len(set(round(g, 2) for g in gaps[3:])) > 1, "jittered, capped"
    broken = False
    for _ in range(40):
        clock.tick(0.25)
        meter.read()
    assert meter.usable()
    assert meter.source_snapshots()[0].error == ""


def test_a_pending_alternative_is_dropped_once_another_reads_the_same_counters(
    roots: Roots, powercap: PowercapTree, clock: FakeClock
) -> None:
    powercap.add("intel-rapl:0", "package-0")
    opened = open_sources(("rapl_sysfs",), {}, roots, clock).sources
    calls: list[int] = []

    def opener() -> Source:
        calls.append(1)
        raise AssertionError("never tried: rapl_sysfs reads these counters")

    meter = EnergyMeter(
        opened, clock=clock, pending=[Pending("rapl_msr", opener, "no msr", frozenset({"rapl_sysfs", "rapl_msr"}))]
    )
    clock.tick()
    meter.read()
    assert not calls and [s.name for s in meter.source_snapshots()] == ["rapl_sysfs"]


def test_readiness_without_any_configured_source_is_ready(running: Running) -> None:
    running.agent.config = replace(running.agent.config, sources=SourcesConfig(order=()))
    running.agent.sampler.config = running.agent.config
    status, body, _ = running.request("GET", "/readyz")
    assert status == 200 and "CPU time only" in body


# -- 3. the power gauge --------------------------------------------------------------------------


def test_the_gauge_is_the_energy_over_a_fixed_window_and_never_one_intervals_jump(
    roots: Roots, powercap: PowercapTree, clock: FakeClock
) -> None:
    powercap.add("intel-rapl:0", "package-0", max_power_uw=250_000_000)
    meter = EnergyMeter(
        open_sources(("rapl_sysfs",), {}, roots, clock).sources,
        clock=clock,
        power_window_seconds=10.0,
        stale_seconds=3.0,
        rescan_seconds=1e9,
    )

    def watts() -> float | None:
        return meter.zone_states()[0][3]

    meter.read()
    assert watts() is None, "one reading: no power yet"
    # 200 W, read at uneven moments (0.7 s, 1.3 s, ...): over the window it is exact
    for i in range(30):
        dt = 0.7 if i % 2 else 1.3
        clock.tick(dt)
        powercap.advance("intel-rapl:0", 200.0 * dt)
        meter.read()
        assert watts() == pytest.approx(200.0)
    # a coarse counter: 2 kJ in a 10 s step, read every second in between
    for _ in range(3):
        for _ in range(10):
            clock.tick()
            meter.read()
        powercap.advance("intel-rapl:0", 2000.0)
        meter.read()
    assert watts() == pytest.approx(200.0, rel=0.11), "the window spans the steps, not one jump"
    # unreadable for 20 s while drawing 150 W: absent (not 0 W) during the gap
    path = powercap.base / "intel-rapl:0" / "energy_uj"
    energy = powercap.energy("intel-rapl:0")
    for _ in range(20):
        clock.tick()
        path.write_text("garbled\n")
        meter.read()
    assert watts() is None
    powercap.set("intel-rapl:0", energy + 150 * 20 * 10**6)
    for _ in range(31):  # readable again: read within one backoff period (30 s at most)
        clock.tick()
        powercap.advance("intel-rapl:0", 150.0)
        meter.read()
        if watts() is not None:
            break
    gauge = watts()
    assert gauge is not None and 150.0 <= gauge <= 200.0, gauge
    # a coarse step right after the start would read 2 kW for one interval: capped at 250 W
    fresh = EnergyMeter(open_sources(("rapl_sysfs",), {}, roots, clock).sources, clock=clock, rescan_seconds=1e9)
    fresh.read()
    clock.tick()
    powercap.advance("intel-rapl:0", 2000.0)
    fresh.read()
    assert fresh.zone_states()[0][3] == 250.0, "never above the zone's stated maximum"


def test_the_zone_maximum_comes_from_the_kernel_or_the_configured_limit(
    roots: Roots, powercap: PowercapTree, clock: FakeClock
) -> None:
    powercap.add("intel-rapl:0", "package-0", max_power_uw=235_000_000)
    powercap.add("intel-rapl:1", "package-1")
    (source,) = open_sources(("rapl_sysfs",), {}, roots, clock).sources
    by_name = {z.name: z for z in source.zones()}
    assert by_name["package-0"].max_watts == 235.0  # type: ignore[attr-defined]
    assert by_name["package-1"].max_watts is None  # type: ignore[attr-defined]
    meter = EnergyMeter([source], clock=clock, max_zone_watts=5000.0)
    assert {zs.info.zone: zs.max_watts for st in meter._sources for zs in st.zones.values()} == {
        "package-0": 235.0,
        "package-1": 5000.0,
    }


# -- 4. JSON for every HTTP error ----------------------------------------------------------------


def _raw(running: Running, data: bytes) -> tuple[int, dict[str, object]]:
    host, port = running.server.server_address[:2]
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(data)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    assert b"Content-Type: application/json" in head, head
    return status, json.loads(body)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\n" + b"X-Long: " + b"a" * 70_000 + b"\r\n\r\n", 431),
        (b"PATCH /v1/windows HTTP/1.1\r\nHost: x\r\n\r\n", 501),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
    ],
    ids=["bad request line", "header too long", "unknown method", "request line too long"],
)
def test_errors_of_the_http_layer_are_json(running: Running, request_bytes: bytes, status: int) -> None:
    got, doc = _raw(running, request_bytes)
    assert got == status and isinstance(doc.get("error"), str) and doc["error"]


def test_a_failing_handler_answers_a_json_500_and_the_server_goes_on(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(label: str = "") -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(running.agent.sampler, "open_window", broken)
    got, doc = _raw(running, b"POST /v1/windows HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    assert got == 500 and doc == {"error": "internal error: RuntimeError"}
    monkeypatch.undo()
    running.agent.step()
    assert running.request("GET", "/healthz")[0] == 200


def test_a_package_in_turbo_above_its_thermal_design_power_is_not_capped_at_it(
    roots: Roots, powercap: PowercapTree, clock: FakeClock
) -> None:
    """The long-term constraint's max_power_uw is the TDP (intel_rapl_common.c: PL1 reads
    THERMAL_SPEC_POWER); a package draws more while PL2 allows. Only PL2/PL4's MAX_POWER caps."""
    powercap.add("intel-rapl:0", "package-0", tdp_uw=125_000_000)
    meter = EnergyMeter(open_sources(("rapl_sysfs",), {}, roots, clock).sources, clock=clock, rescan_seconds=1e9)
    meter.read()
    for _ in range(10):
        clock.tick()
        powercap.advance("intel-rapl:0", 150.0)
        meter.read()
    assert meter.zone_states()[0][3] == pytest.approx(150.0)
