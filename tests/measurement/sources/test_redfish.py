"""redfish: recorded chassis trees served on loopback, and discovery against the real sushy-tools emulator."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources import redfish
from joulesched.measurement.sources.base import Reading, Roots, Source, Zone
from joulesched.measurement.sources.redfish import JOULES_PER_KWH, whole_power_control
from tests.contracts.hops import non_loopback_address
from tests.measurement.fakes import FakeClock
from tests.measurement.sources.redfish_support import (
    REDFISH_FIXTURES,
    MockupServer,
    free_tcp_port,
    make_ca_and_server_cert,
    sushy_emulator,
)

needs_crypto = pytest.mark.skipif(importlib.util.find_spec("cryptography") is None, reason="cryptography not installed")
NON_LOOPBACK = non_loopback_address()
needs_non_loopback = pytest.mark.skipif(NON_LOOPBACK is None, reason="this host has no non-loopback IPv4 address")
needs_sushy = pytest.mark.skipif(
    importlib.util.find_spec("sushy_tools") is None or importlib.util.find_spec("bcrypt") is None,
    reason="sushy-tools not installed (pip install sushy-tools)",
)

# Every recorded tree, by hardware: zone name -> (kind, parent, mechanism, first reading).
# None: no chassis is metered.
EXPECTED: dict[str, dict[str, tuple[str, str | None, str, float]] | None] = {
    "dell-poweredge-r750-idrac9": {
        "chassis-System.Embedded.1": ("power", None, "Power.PowerControl[0].PowerConsumedWatts", 312),
    },
    "hpe-proliant-dl360-gen11-ilo6": {
        "chassis-1": ("counter", None, "EnvironmentMetrics.EnergykWh", 1523.417 * JOULES_PER_KWH),
        "chassis-1-power": ("power", "chassis-1", "EnvironmentMetrics.PowerWatts", 226),
    },
    "lenovo-thinksystem-sr650-v2-xcc": {
        "chassis-1": ("power", None, "Power.PowerControl[2].PowerConsumedWatts", 287),  # not the CPU or memory member
    },
    "supermicro-sys-121c-tn10r-x13": {
        "chassis-1": ("power", None, "PowerSubsystem: sum of 2 supplies' InputPowerWatts", 151 + 148),
    },
    "blade-enclosure-two-level": {
        "chassis-Enclosure": ("power", None, "EnvironmentMetrics.PowerWatts", 1830),
        "chassis-Blade3": ("power", "chassis-Enclosure", "Power.PowerControl[0].PowerConsumedWatts", 412),
    },
    "generic-bmc-thermal-only": None,
}

TREES = sorted(p.name for p in REDFISH_FIXTURES.iterdir() if p.is_dir())


def test_every_recorded_tree_has_an_expectation() -> None:
    assert sorted(EXPECTED) == TREES


@pytest.mark.parametrize("hardware", TREES)
def test_recorded_tree_gives_its_hardware_zones(hardware: str) -> None:
    expected = EXPECTED[hardware]
    with MockupServer(REDFISH_FIXTURES / hardware) as server:
        if expected is None:
            with pytest.raises(SourceAbsent, match=r"no chassis offers a power reading — chassis 1 \(no Power"):
                redfish.open_source({"url": server.url}, Roots())
            return
        source = redfish.open_source({"url": server.url}, Roots())
        try:
            assert isinstance(source, Source)
            got = {}
            for zone in source.zones():
                assert isinstance(zone, Zone)
                assert zone.domain == "platform"
                got[zone.name] = (zone.kind, zone.parent, zone.mechanism, zone.read().value)
            assert got == expected
            names = {z.name for z in source.zones()}
            assert all(z.parent is None or z.parent in names for z in source.zones()), (
                "parents are zones of this source"
            )
        finally:
            source.close()


def test_a_read_is_one_request_over_one_kept_alive_connection() -> None:
    with MockupServer(REDFISH_FIXTURES / "dell-poweredge-r750-idrac9") as server:
        source = redfish.open_source({"url": server.url}, Roots())
        (zone,) = source.zones()
        before, connections = len(server.requests), server.connections
        for _ in range(3):
            zone.read()
        assert server.requests[before:] == ["/redfish/v1/Chassis/System.Embedded.1/Power"] * 3
        assert server.connections == connections == 1
        source.close()


def test_a_new_reading_is_seen_and_stamped_on_the_agents_clock() -> None:
    ticks = iter(range(100, 200))
    with MockupServer(REDFISH_FIXTURES / "hpe-proliant-dl360-gen11-ilo6") as server:
        source = redfish.open_source({"url": server.url, "clock": lambda: float(next(ticks))}, Roots())
        path = "/redfish/v1/Chassis/1/EnvironmentMetrics"
        server.overrides[path] = {"PowerWatts": {"Reading": 240.5}, "EnergykWh": {"Reading": 1523.5}}
        energy, power = source.zones()
        first = power.read()
        assert first.value == 240.5
        assert first.timestamp == int(first.timestamp) + 0.5, "the midpoint of the request"
        assert energy.read().value == pytest.approx(1523.5 * 3.6e6)
        source.close()


def test_the_energy_counter_is_primary_by_default_and_prefer_power_swaps_them() -> None:
    with MockupServer(REDFISH_FIXTURES / "hpe-proliant-dl360-gen11-ilo6") as server:
        source = redfish.open_source({"url": server.url}, Roots())
        assert [(z.name, z.kind, z.parent) for z in source.zones()] == [
            ("chassis-1", "counter", None),
            ("chassis-1-power", "power", "chassis-1"),
        ]
        source.close()
        source = redfish.open_source({"url": server.url, "prefer": "power"}, Roots())
        assert [(z.name, z.kind, z.parent) for z in source.zones()] == [
            ("chassis-1", "power", None),
            ("chassis-1-energy", "counter", "chassis-1"),
        ]
        source.close()


def test_one_get_per_resource_per_read_and_a_null_power_keeps_the_source_up() -> None:
    """The meter reads both zones of a chassis in one pass: EnvironmentMetrics is fetched once.
    A null PowerWatts next to a reading EnergykWh leaves the source up, the error exported."""
    from joulesched.measurement.meter import EnergyMeter

    path = "/redfish/v1/Chassis/1/EnvironmentMetrics"
    clock = FakeClock()
    with MockupServer(REDFISH_FIXTURES / "hpe-proliant-dl360-gen11-ilo6") as server:
        source = redfish.open_source({"url": server.url}, Roots(), clock=clock)
        try:
            meter = EnergyMeter([source], clock=clock, rescan_seconds=1e9)
            server.requests.clear()
            meter.read()
            assert server.requests.count(path) == 1, server.requests
            clock.tick(1.0)
            server.overrides[path] = {"PowerWatts": {"Reading": None}, "EnergykWh": {"Reading": 1523.418}}
            totals = meter.read().totals
            (health,) = meter.source_snapshots()
            assert health.up, health
            assert "has no PowerWatts.Reading now" in health.error
            assert totals[("redfish", "chassis-1")] == pytest.approx(0.001 * JOULES_PER_KWH * 1e9, rel=1e-6)
            assert server.requests.count(path) == 2
        finally:
            source.close()


def test_chassis_option_selects_and_unknown_ids_are_named() -> None:
    with MockupServer(REDFISH_FIXTURES / "blade-enclosure-two-level") as server:
        source = redfish.open_source({"url": server.url, "chassis": ["Blade3"]}, Roots())
        assert [(z.name, z.parent) for z in source.zones()] == [("chassis-Blade3", None)]
        with pytest.raises(SourceFailed, match=r"chassis Blade9 .* not found; chassis present: Enclosure, Blade3"):
            redfish.open_source({"url": server.url, "chassis": ["Blade9"]}, Roots())


def test_a_reading_that_disappears_fails_the_read_and_names_the_resource() -> None:
    with MockupServer(REDFISH_FIXTURES / "dell-poweredge-r750-idrac9") as server:
        source = redfish.open_source({"url": server.url}, Roots())
        server.overrides["/redfish/v1/Chassis/System.Embedded.1/Power"] = {
            "PowerControl": [{"PowerConsumedWatts": None}]
        }
        with pytest.raises(SourceFailed, match=r"System.Embedded.1/Power PowerControl\[0\] has no PowerConsumedWatts"):
            source.zones()[0].read()


@pytest.mark.parametrize(
    ("members", "expected"),
    [
        ([{"PowerConsumedWatts": 300}], (0, 300.0)),
        ([{"PhysicalContext": "CPU", "PowerConsumedWatts": 90}, {"PowerConsumedWatts": 300}], (1, 300.0)),
        (
            [
                {"PhysicalContext": "CPU", "PowerConsumedWatts": 90},
                {"PhysicalContext": "Memory", "PowerConsumedWatts": 20},
            ],
            None,
        ),
        ([{"PhysicalContext": "PowerSupply", "PowerConsumedWatts": 310}], (0, 310.0)),
        ([{"PowerConsumedWatts": None}], None),
    ],
    ids=[
        "one member is the total",
        "a member without context beats a CPU member",
        "only parts: no total is invented",
        "a lone member is the total whatever its context",
        "a null reading is no reading",
    ],
)
def test_whole_power_control(members: list[dict[str, Any]], expected: tuple[int, float] | None) -> None:
    assert whole_power_control(members) == expected


# --- errors -----------------------------------------------------------------------------------------


def test_without_url_the_source_is_absent() -> None:
    with pytest.raises(SourceAbsent, match="no url configured"):
        redfish.open_source({}, Roots())


def test_invalid_options_are_reported_all_at_once(tmp_path: Path) -> None:
    with pytest.raises(SourceFailed) as info:
        redfish.open_source(
            {
                "url": "ftp://bmc",
                "password": "x",
                "prefer": "both",
                "tls_verify": "no",
                "password_file": str(tmp_path / "missing"),
            },
            Roots(),
        )
    message = str(info.value)
    for expected in (
        "password: not accepted",
        "prefer: must be power or energy",
        "tls_verify: must be true or false",
        "password_file: cannot read",
        "url: must be an http:// or https:// URL, got 'ftp://bmc'",
    ):
        assert expected in message


@needs_non_loopback
def test_a_password_over_plain_http_off_loopback_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("BMC-PASSWORD\n")
    assert NON_LOOPBACK is not None
    with MockupServer(
        REDFISH_FIXTURES / "dell-poweredge-r750-idrac9", credentials=("monitor", "BMC-PASSWORD"), host=NON_LOOPBACK
    ) as bmc:
        options: dict[str, object] = {"url": bmc.url, "username": "monitor", "password_file": str(secret)}
        with pytest.raises(SourceFailed) as info:
            redfish.open_source(options, Roots())
        message = str(info.value)
        assert "url: http:// would send the BMC password (password_file) in cleartext" in message
        assert "use https://, or set allow_plain_http: true" in message
        assert bmc.requests == []  # refused before the first GET: the password never left
        # the operator's explicit opt-in: it works, and the log says what it costs
        source = redfish.open_source({**options, "allow_plain_http": True}, Roots())
        assert source.zones()[0].read().value == 312
        assert any("password is sent in cleartext (allow_plain_http: true)" in note for note in source.notes)
        source.close()


def test_plain_http_without_a_password_or_to_loopback_needs_no_opt_in(tmp_path: Path) -> None:
    assert redfish.check_options({"url": "http://bmc.example", "username": "monitor"}) == []
    assert redfish.check_options({"url": "http://127.0.0.1:8000", "password_env": "PW"}) == []
    assert redfish.check_options({"url": "http://[::1]:8000", "password_env": "PW"}) == []
    assert redfish.check_options({"url": "http://localhost:8000", "password_env": "PW"}) == []
    assert redfish.check_options({"url": "https://bmc.example", "password_env": "PW"}) == []
    assert redfish.check_options({"url": "http://bmc.example", "password_env": "PW", "allow_plain_http": "yes"}) == [
        "allow_plain_http: must be true or false, got 'yes'",
        "url: http:// would send the BMC password (password_env) in cleartext to bmc.example: use https://, or set"
        " allow_plain_http: true to accept that on a network you trust (loopback needs neither)",
    ]


def test_credentials_in_the_url_are_refused_without_repeating_them() -> None:
    with MockupServer(REDFISH_FIXTURES / "dell-poweredge-r750-idrac9") as bmc:
        url = bmc.url.replace("http://", "http://monitor:BMC-PASSWORD@")
        with pytest.raises(SourceFailed) as info:
            redfish.open_source({"url": url}, Roots())
        assert bmc.requests == []
    message = str(info.value)
    assert "url: must not carry credentials" in message and "use password_file or password_env" in message
    assert "BMC-PASSWORD" not in message
    with pytest.raises(ValueError) as bad:
        redfish.RedfishClient(url)
    assert "BMC-PASSWORD" not in str(bad.value)


def test_the_password_is_not_in_the_clients_repr() -> None:
    client = redfish.RedfishClient("https://bmc.example", "monitor", "BMC-PASSWORD")
    assert "BMC-PASSWORD" not in repr(client)
    assert "monitor" in repr(client)


def test_an_unreachable_bmc_names_the_url_and_the_cause() -> None:
    port = free_tcp_port()
    with pytest.raises(
        SourceFailed, match=rf"redfish \(http://127.0.0.1:{port}\): GET /redfish/v1/Chassis: Connection refused"
    ):
        redfish.open_source({"url": f"http://127.0.0.1:{port}", "timeout_s": 2}, Roots())


def test_wrong_credentials_are_a_401_naming_the_user(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("wrong\n")
    with MockupServer(REDFISH_FIXTURES / "dell-poweredge-r750-idrac9", credentials=("monitor", "right")) as server:
        with pytest.raises(
            SourceFailed, match=r"HTTP 401 Unauthorized \(user 'monitor'\) — check username and password"
        ):
            redfish.open_source({"url": server.url, "username": "monitor", "password_file": str(secret)}, Roots())
        secret.write_text("right\n")
        source = redfish.open_source({"url": server.url, "username": "monitor", "password_file": str(secret)}, Roots())
        assert source.zones()[0].read().value == 312


@needs_crypto
def test_tls_is_verified_against_the_configured_ca(tmp_path: Path) -> None:
    ca, cert, key = make_ca_and_server_cert(tmp_path)
    with MockupServer(REDFISH_FIXTURES / "dell-poweredge-r750-idrac9", tls=(cert, key)) as server:
        with pytest.raises(SourceFailed, match=r"TLS certificate not trusted .* set ca_file"):
            redfish.open_source({"url": server.url}, Roots())
        source = redfish.open_source({"url": server.url, "ca_file": str(ca)}, Roots())
        assert source.zones()[0].read().value == 312
        unverified = redfish.open_source({"url": server.url, "tls_verify": False}, Roots())
        assert any("not verified" in note for note in unverified.notes)


# --- the real sushy-tools emulator ------------------------------------------------------------------


@needs_sushy
def test_sushy_emulator_chassis_are_discovered_and_reported_without_power(tmp_path: Path) -> None:
    """sushy-tools 2.x serves Chassis and Thermal but no Power, PowerSubsystem or EnvironmentMetrics."""
    with sushy_emulator(tmp_path) as url:
        with pytest.raises(SourceAbsent) as info:
            redfish.open_source({"url": url}, Roots())
    message = str(info.value)
    assert f"redfish ({url}): no chassis offers a power reading — chassis " in message
    assert "(no Power, PowerSubsystem or EnvironmentMetrics link)" in message
    assert "read power through ipmi_dcmi or ipmi_sdr" in message


@needs_sushy
@needs_crypto
def test_sushy_emulator_over_tls_with_basic_auth(tmp_path: Path) -> None:
    ca, cert, key = make_ca_and_server_cert(tmp_path)
    secret = tmp_path / "pw"
    secret.write_text("wrong\n")
    with sushy_emulator(tmp_path, credentials=("admin", "password"), tls=(cert, key)) as url:
        with pytest.raises(SourceFailed, match="TLS certificate not trusted"):
            redfish.open_source({"url": url, "username": "admin", "password_file": str(secret)}, Roots())
        with pytest.raises(SourceFailed, match=r"GET /redfish/v1/Chassis: HTTP 401 Unauthorized \(user 'admin'\)"):
            redfish.open_source(
                {"url": url, "username": "admin", "password_file": str(secret), "ca_file": str(ca)}, Roots()
            )
        secret.write_text("password\n")
        with pytest.raises(SourceAbsent, match="no chassis offers a power reading"):
            redfish.open_source(
                {"url": url, "username": "admin", "password_file": str(secret), "ca_file": str(ca)}, Roots()
            )


def test_the_registry_opens_it_by_name_with_the_samplers_clock() -> None:
    from joulesched.measurement.sources.registry import open_one

    with MockupServer(REDFISH_FIXTURES / "lenovo-thinksystem-sr650-v2-xcc") as server:
        source = open_one("redfish", {"url": server.url}, Roots(), clock=lambda: 7.0)
        assert source.zones()[0].read() == Reading(287.0, 7.0)
        source.close()  # type: ignore[attr-defined]


def test_a_bmc_that_trickles_its_reply_fails_the_get_within_its_timeout() -> None:
    # Its head at once, then a byte every 0.2 s of a body it never finishes: each read is
    # within the timeout, the reply is not. Before, the GET went on for as long as the BMC
    # liked, and its source stayed up with no error while no energy was read.
    import socket
    import threading
    import time

    from tests.support import trickle

    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
            trickle(conn, stop, 0.2, times=25)  # 5 s, then it gives up too (a test that fails, not one that hangs)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    client = redfish.RedfishClient(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.6)
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=r"no whole reply within 0\.6 s"):
            client.get("/redfish/v1/Chassis/1/Power")
        assert time.monotonic() - started < 1.5
    finally:
        stop.set()
        client.close_connection()
        server.join(5)
        listener.close()
