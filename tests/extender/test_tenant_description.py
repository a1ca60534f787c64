"""extender/tenant.py: the registrar's server descriptions are read again as they age.

The provider's agent PUTs ``/servers/{id}`` when a server's description changes
(docs/provider.md): the tenant source reads each description again once it is
``DESCRIPTION_SECONDS`` old, and sooner (``RETRY_DESCRIPTION_SECONDS`` after it was last asked
for) when the one it holds gives no profile. Before, a description was read once per id and
kept for the life of the process.
"""

from __future__ import annotations

import logging
import urllib.error

import pytest

from joulesched.contracts.errors import NadikiReadError
from joulesched.contracts.nadiki import DataPoint, Processor, ServerDescription
from joulesched.contracts.nadiki_read import NadikiServer, Windows
from joulesched.extender.tenant import DESCRIPTION_SECONDS, RETRY_DESCRIPTION_SECONDS, TenantConfig, TenantSource

POINT = DataPoint("server", "server_energy_consumption_joules", 30, {})
OTHER = DataPoint("server", "server_temperature", 30, {})


def described(server_id: str, cores: int = 16, rated_kw: float = 0.35, points: tuple[DataPoint, ...] = (POINT,)) -> NadikiServer:
    return NadikiServer(
        server_id, ServerDescription("F", "R", rated_power=rated_kw, installed_cpus=(Processor("x", "y", cores),)), points
    )


class Registrar:
    """``GET /servers/{id}``: the description ``current`` holds for it; a ``failure`` raised instead."""

    def __init__(self, current: dict[str, NadikiServer]) -> None:
        self.current = current
        self.failure: NadikiReadError | None = None
        self.gets: list[str] = []

    def server(self, server_id: str) -> NadikiServer:
        self.gets.append(server_id)
        if self.failure is not None:
            raise self.failure
        return self.current[server_id]


class Store:
    def __init__(self, ids: list[str]) -> None:
        self.ids = ids

    def query(self, q: str) -> list[dict[str, object]]:
        return [{"values": [["server_id", i] for i in self.ids]}]

    def windows(self, point: DataPoint, server_id: str, start: float, end: float) -> Windows:
        return Windows(server_id, 30, (end - 60, end - 30), (6000.0, 7500.0))


def source(registrar: Registrar, ids: list[str], now: list[float]) -> TenantSource:
    config = TenantConfig(registrar_url="http://r", influx_url="http://i", database="d", cache_seconds=30)
    src = TenantSource(config, clock=lambda: now[0])
    src.registrar, src.reader = registrar, Store(ids)  # type: ignore[assignment]
    return src


def nodes(src: TenantSource) -> dict[str, tuple[float, float]]:
    """name -> (cores, full watts) of the last snapshot's profiles."""
    return {p.name: (p.cores, p.power_curve_watts[-1]) for p in src._last.profiles.nodes}


def test_a_description_the_provider_puts_is_read_once_the_held_one_is_DESCRIPTION_SECONDS_old() -> None:
    now = [1_000_000.0]
    registrar = Registrar({"S1": described("S1", 16, 0.35)})
    src = source(registrar, ["S1"], now)
    src._refresh()
    assert nodes(src) == {"S1": (32.0, 350.0)}
    registrar.current["S1"] = described("S1", 32, 0.7)  # the provider PUTs a corrected description
    while now[0] + 30 < 1_000_000.0 + DESCRIPTION_SECONDS:  # refreshes every 30 s: the held one serves
        now[0] += 30
        src._refresh()
    assert nodes(src) == {"S1": (32.0, 350.0)} and registrar.gets == ["S1"]
    now[0] = 1_000_000.0 + DESCRIPTION_SECONDS
    src._refresh()
    assert nodes(src) == {"S1": (64.0, 700.0)} and registrar.gets == ["S1", "S1"]
    now[0] += 30
    src._refresh()
    assert registrar.gets == ["S1", "S1"]  # read again only DESCRIPTION_SECONDS later


def test_a_held_description_that_gives_no_profile_is_read_again_within_the_refresh_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Registered first without its energy series (the agent adds it, and PUTs): the profile
    # comes at the first refresh a minute after the description was read, not 10 minutes later.
    now = [1_000_000.0]
    registrar = Registrar({"S1": described("S1", points=(OTHER,))})
    src = source(registrar, ["S1"], now)
    src._refresh()
    assert nodes(src) == {} and registrar.gets == ["S1"]
    now[0] += 30
    src._refresh()
    assert registrar.gets == ["S1"]  # asked for 30 s ago: not again yet
    now[0] += RETRY_DESCRIPTION_SECONDS - 30
    src._refresh()
    assert registrar.gets == ["S1", "S1"] and nodes(src) == {}  # asked again: the same, still none
    registrar.current["S1"] = described("S1")
    now[0] += 30
    src._refresh()
    assert registrar.gets == ["S1", "S1"]  # a minute between two reads of a server without a profile
    now[0] += 30
    with caplog.at_level(logging.INFO, logger="joulesched.extender.tenant"):
        src._refresh()
    assert registrar.gets == ["S1", "S1", "S1"] and nodes(src) == {"S1": (32.0, 350.0)}  # in the same refresh
    assert "server S1: the registrar's description has changed" in caplog.text


def test_a_registrar_that_fails_a_read_again_keeps_the_held_descriptions_and_a_down_one_costs_one_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1_000_000.0]
    ids = ["S1", "S2", "S3"]
    registrar = Registrar({i: described(i) for i in ids})
    src = source(registrar, ids, now)
    src._refresh()
    assert len(registrar.gets) == 3
    # Down: the first read again times out, the others wait for the next try.
    down = NadikiReadError("NADIKI registrar http://r: GET /servers/S1: timed out")
    down.__cause__ = TimeoutError("timed out")
    registrar.failure = down
    now[0] += DESCRIPTION_SECONDS
    with caplog.at_level(logging.WARNING, logger="joulesched.extender.tenant"):
        src._refresh()
    assert registrar.gets[3:] == ["S1"]
    assert set(nodes(src)) == set(ids)  # the held descriptions serve on
    assert "server S1: keeping the description read before: cannot read it again: NADIKI registrar" in caplog.text
    # Answering, but refusing one: each is asked, each keeps its own.
    refused = NadikiReadError("NADIKI registrar http://r: GET /servers/S1: HTTP 500 Internal Server Error")
    refused.__cause__ = urllib.error.HTTPError("http://r/servers/S1", 500, "Internal Server Error", {}, None)  # type: ignore[arg-type]
    registrar.failure = refused
    now[0] += RETRY_DESCRIPTION_SECONDS - 1
    src._refresh()
    assert registrar.gets[4:] == []  # tried again RETRY_DESCRIPTION_SECONDS later, not sooner
    now[0] += 1
    src._refresh()
    assert registrar.gets[4:] == ids and set(nodes(src)) == set(ids)
    registrar.failure = None
    registrar.current["S2"] = described("S2", 8, 0.5)
    now[0] += RETRY_DESCRIPTION_SECONDS
    src._refresh()
    assert registrar.gets[7:] == ids and nodes(src)["S2"] == (16.0, 500.0)


def test_a_server_no_longer_in_the_store_is_forgotten() -> None:
    now = [1_000_000.0]
    registrar = Registrar({"S1": described("S1"), "S2": described("S2")})
    src = source(registrar, ["S1", "S2"], now)
    src._refresh()
    src.reader.ids = ["S1"]  # type: ignore[attr-defined]
    now[0] += 30
    src._refresh()
    assert set(src._servers) == {"S1"} and set(nodes(src)) == {"S1"}
    src.reader.ids = ["S1", "S2"]  # type: ignore[attr-defined]
    now[0] += 30
    src._refresh()
    assert registrar.gets == ["S1", "S2", "S2"]  # read afresh when it comes back
