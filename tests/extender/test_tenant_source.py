"""The ``tenant`` profile source end to end: the provider's agent registers two servers and pushes
their energy into a real InfluxDB (tests/nadiki_tenant.py); the extender, configured with
``profiles.source: tenant``, reads them back through the registrar and InfluxDB's ``/query``,
and scores VM nodes by the server their ``joulesched.io/server-id`` label names."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from joulesched.contracts.nadiki import DataPoint
from joulesched.contracts.nadiki_read import InfluxReader
from joulesched.extender.app import create_app
from joulesched.extender.config import parse_config
from joulesched.extender.metrics import ExtenderMetrics
from joulesched.extender.tenant import TenantSource
from joulesched.policy.errors import ConfigError
from tests.extender.support import make_pod, post
from tests.nadiki_tenant import BUCKET, T0, Host, Provider, provider
from tests.support import Clock

LABEL = "joulesched.io/server-id"
FRUGAL = Host("FAC-1", "RACK-1", base_watts=180.0, swing_watts=60.0, rated_kw=0.35)
HUNGRY = Host("FAC-1", "RACK-2", base_watts=420.0, swing_watts=100.0, rated_kw=0.9)
LAST = T0 + 1800.0


@pytest.fixture(scope="module")
def side(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    with provider(tmp_path_factory.mktemp("tenant"), [FRUGAL, HUNGRY], T0 + 3.0, LAST) as p:
        yield p


def config(side: Provider, **extra: object) -> dict[str, object]:
    tenant = {"registrar_url": side.registrar_url, "influx_url": side.influx.url, "database": BUCKET, **extra}
    return {"profiles": {"source": "tenant", "tenant": tenant}}


def ids(side: Provider) -> dict[Host, str]:
    return {host: server_id for server_id, host in side.servers.items()}


def test_each_server_becomes_a_profile_keyed_by_its_id(side: Provider) -> None:
    clock = Clock(LAST)
    source = TenantSource(parse_config(config(side), "t").tenant, clock=clock)
    snap = source.snapshot()
    assert snap.error == "" and source.errors == 0
    profiles = {p.server_id: p for p in snap.profiles.nodes}
    assert set(profiles) == set(side.servers)
    reader = InfluxReader(side.influx.url, BUCKET)
    for server_id, host in side.servers.items():
        p = profiles[server_id]
        assert p.name == server_id and p.cores == 64  # 2 CPUs × 16 cores × 2 threads
        assert p.power_curve_watts[-1] == pytest.approx(host.rated_kw * 1000)
        windows = reader.windows(DataPoint("server", "server_energy_consumption_joules", 30, {}), server_id, T0, LAST)
        # the newest window is the profile's measurement; the lowest is its idle power
        assert p.updated == windows.starts[-1] + 30
        assert p.measured_watts == pytest.approx(windows.joules[-1] / 30)
        assert p.idle_watts == pytest.approx(min(windows.joules) / 30)
        # and the windows are the server's true energy (the counter between their edges)
        start = windows.starts[-1]
        truth = (host.counter(start + 30) - host.counter(start)) / 30
        assert p.measured_watts == pytest.approx(truth, rel=1e-3)
        assert host.base_watts - host.swing_watts <= p.idle_watts < host.base_watts - 0.9 * host.swing_watts
        assert 0 < p.utilisation < 1


def test_vm_nodes_are_scored_by_the_server_their_label_names(side: Provider) -> None:
    parsed = parse_config(config(side), "t")
    clock = Clock(LAST)
    app = create_app(
        parsed,
        source=TenantSource(parsed.tenant, clock=clock),
        metrics=ExtenderMetrics(CollectorRegistry()),
        clock=clock,
        background=False,
    )
    server = ids(side)
    items = [
        {"metadata": {"name": "vm-hungry", "labels": {LABEL: server[HUNGRY]}}},
        {"metadata": {"name": "vm-frugal", "labels": {LABEL: server[FRUGAL]}}},
        {"metadata": {"name": "vm-unknown", "labels": {LABEL: "SERVER-NOWHERE"}}},
        {"metadata": {"name": "vm-plain"}},
    ]
    status, scores = post(app.test_client(), "prioritize", {"Pod": make_pod(), "Nodes": {"items": items}})
    assert status == 200
    by = {s["Host"]: s["Score"] for s in scores}
    assert by["vm-frugal"] > by["vm-hungry"]
    assert by["vm-unknown"] == by["vm-plain"]  # neutral: no profile for them


def test_a_store_that_goes_away_keeps_the_last_profiles_and_counts_the_failure(side: Provider) -> None:
    clock = Clock(LAST)
    source = TenantSource(parse_config(config(side, cache_seconds=0), "t").tenant, clock=clock)
    first = source.snapshot()  # the first load waits for the store
    assert len(first.profiles.nodes) == 2 and first.error == ""
    source.reader = InfluxReader("http://127.0.0.1:9", BUCKET)  # the store is gone
    clock.tick(1.0)
    assert source.snapshot() is first  # never waits: the refresh runs in the background
    deadline = time.monotonic() + 10
    while not source._last.error and time.monotonic() < deadline:
        time.sleep(0.02)
    snap = source._last
    assert source.errors >= 1 and "127.0.0.1:9" in snap.error
    assert snap.profiles == first.profiles and snap.loaded_at == first.loaded_at  # the last good ones, ageing
    dead = TenantSource(parse_config(config(side, influx_url="http://127.0.0.1:9"), "t").tenant, clock=clock)
    assert not dead.snapshot().ready and dead.errors == 1


def test_a_server_without_windows_in_the_history_is_left_out(side: Provider, caplog: pytest.LogCaptureFixture) -> None:
    later = LAST + 7 * 3600.0  # past the 6 h history: nothing pushed since
    source = TenantSource(parse_config(config(side), "t").tenant, clock=Clock(later))
    with caplog.at_level("INFO"):
        snap = source.snapshot()
    assert snap.profiles.nodes == () and source.errors == 0
    assert "no energy window in the last 21600 s" in caplog.text


def test_the_config_names_every_missing_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"profiles": {"source": "tenant", "tenant": {"influx_url": "influx:8086"}}}, "extender.yaml")
    text = str(err.value)
    assert "profiles.tenant.registrar_url: is required" in text
    assert "profiles.tenant.influx_url: must be an http:// or https:// URL" in text
    assert "profiles.tenant.database: is required" in text
    # The secret files are read with the config, before any worker starts, relative to its folder.
    (tmp_path / "password").write_text("")
    doc = {"registrar_url": "https://r", "influx_url": "https://i", "database": "d", "password_file": "password",
           "registrar_token_file": "/nonexistent/token"}  # fmt: skip
    with pytest.raises(ConfigError) as err:
        parse_config({"profiles": {"source": "tenant", "tenant": doc}}, "extender.yaml", tmp_path)
    assert err.value.problems == [
        "profiles.tenant.registrar_token_file: /nonexistent/token: cannot read: No such file or directory",
        f"profiles.tenant.password_file: {tmp_path / 'password'}: the file is empty",
    ]
    (tmp_path / "password").write_text("secret\n")
    doc.pop("registrar_token_file")
    config = parse_config({"profiles": {"source": "tenant", "tenant": doc}}, "extender.yaml", tmp_path)
    assert TenantSource(config.tenant)._password == "secret"


def test_the_extender_builds_the_tenant_source_from_its_config(side: Provider) -> None:
    from joulesched.extender.app import make_source

    source = make_source(parse_config(config(side), "t"))
    assert isinstance(source, TenantSource) and source.name == "tenant"


def test_influxdb_credentials_are_sent_and_a_refusal_is_named(tmp_path: Path) -> None:
    """InfluxDB 1.x with authentication on: the password file's secret goes as HTTP Basic."""
    with provider(tmp_path, [FRUGAL], T0 + 3.0, T0 + 600.0, credentials=("tenant", "s3cret")) as p:
        good, bad = tmp_path / "good", tmp_path / "bad"
        good.write_text("s3cret\n")
        bad.write_text("guess\n")
        clock = Clock(T0 + 600.0)
        ok = TenantSource(parse_config(config(p, username="tenant", password_file=str(good)), "t").tenant, clock=clock)
        assert len(ok.snapshot().profiles.nodes) == 1 and ok.errors == 0
        refused = TenantSource(
            parse_config(config(p, username="tenant", password_file=str(bad)), "t").tenant, clock=clock
        )
        snap = refused.snapshot()
        assert refused.errors == 1 and "HTTP 401" in snap.error and "credentials were refused" in snap.error


def test_one_servers_bad_window_leaves_that_server_out_not_every_server() -> None:
    """A window the store cannot give as joules (a negative one) fails that server's read only:
    the others are read on, as a registrar's refusal of one server already was."""
    from joulesched.contracts.errors import NadikiReadError
    from joulesched.contracts.nadiki import Processor, ServerDescription
    from joulesched.contracts.nadiki_read import NadikiServer, Windows
    from joulesched.extender.tenant import TenantConfig

    point = DataPoint("server", "server_energy_consumption_joules", 30, {})

    class Registrar:
        def server(self, server_id: str) -> NadikiServer:
            description = ServerDescription("F", "R", rated_power=0.5, installed_cpus=(Processor("Intel", "Xeon", 16),))
            return NadikiServer(server_id, description, (point,))

    class Store:
        bad = False

        def query(self, q: str) -> list[dict[str, object]]:
            return [{"values": [["server_id", "srv-good"], ["server_id", "srv-bad"]]}]

        def windows(self, point: DataPoint, server_id: str, start: float, end: float) -> Windows:
            if server_id == "srv-bad" and self.bad:
                raise NadikiReadError(f"InfluxDB: server {server_id}: window at 123 holds -5.0, not joules")
            last = (end // 30) * 30 - 30
            return Windows(server_id, 30, (last - 30, last), (6000.0, 7500.0))

    clock = Clock(1_000_000.0)
    source = TenantSource(TenantConfig(registrar_url="http://r", influx_url="http://i", database="d", cache_seconds=30), clock=clock)
    store = Store()
    source.reader, source.registrar = store, Registrar()  # type: ignore[assignment]
    assert {p.name for p in source.snapshot().profiles.nodes} == {"srv-good", "srv-bad"}
    store.bad = True
    clock.tick(31)
    source._refresh()
    snap = source.snapshot()
    assert not snap.error and source.errors == 0
    assert [p.name for p in snap.profiles.nodes] == ["srv-good"] and snap.profiles.nodes[0].updated is not None
    assert clock() - snap.profiles.nodes[0].updated <= 60, "srv-good read afresh"


def test_credentials_never_in_a_url_nor_in_cleartext_off_loopback(tmp_path: Path) -> None:
    # contracts.net's rules, checked with the config: a URL that carries user:password@ (it ends
    # up in logs and errors) is refused without repeating the password; the token and password go
    # over http:// only to loopback or with profiles.tenant.allow_plain_http.
    (tmp_path / "secret").write_text("s3cret\n")

    def problems(**tenant: Any) -> list[str]:
        doc = {"registrar_url": "https://r", "influx_url": "https://i", "database": "d", **tenant}
        try:
            parse_config({"profiles": {"source": "tenant", "tenant": doc}}, "extender.yaml", tmp_path)
        except ConfigError as err:
            return err.problems
        return []

    (said,) = problems(influx_url="https://reader:hunter2@i")
    assert said.startswith("profiles.tenant.influx_url: must not carry credentials") and "hunter2" not in said
    assert "profiles.tenant.password_file" in said
    assert problems(influx_url="http://i") == []  # no password to send
    (said,) = problems(influx_url="http://i", password_file="secret")
    assert said.startswith("profiles.tenant.influx_url: http:// would send the InfluxDB password (password_file) in cleartext to i")
    assert "profiles.tenant.allow_plain_http: true" in said
    (said,) = problems(registrar_url="http://r", registrar_token_file="secret")
    assert said.startswith("profiles.tenant.registrar_url: http:// would send the registrar token")
    assert problems(influx_url="http://127.0.0.1:8086", password_file="secret", registrar_url="http://localhost:1",
                    registrar_token_file="secret") == []
    assert problems(influx_url="http://i", password_file="secret", allow_plain_http=True) == []
    with pytest.raises(ConfigError) as err:
        parse_config({"profiles": {"source": "prometheus", "prometheus": {"url": "http://u:pw@prom:9090"}}}, "extender.yaml")
    (said,) = err.value.problems
    assert said.startswith("profiles.prometheus.url: must not carry credentials") and "pw@" not in said
