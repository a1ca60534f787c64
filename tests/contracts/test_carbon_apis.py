"""Live carbon-intensity sources against local servers that replay each API's documented answers.

Every test drives an injected clock, so refresh intervals and ages are exact and nothing waits
on the machine's speed; only the deadline tests measure time, against bounds far from the values
a hang would give.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from joulesched.contracts.carbon_apis import ApiSettings, Secret, live_source, open_source
from joulesched.contracts.carbon_apis.base import LiveIntensity, get_json
from joulesched.contracts.carbon_apis.watttime import G_PER_KWH_PER_LBS_PER_MWH, WattTime
from joulesched.contracts.errors import CarbonApiError
from joulesched.contracts.net import free_port
from joulesched.contracts.sitefile import load_site_file, parse_site_document
from joulesched.policy.errors import ConfigError
from joulesched.policy.site import ConstantIntensity, IntensityUnavailable, WithFallback
from tests.contracts.api_server import ApiServer, Clock, Reply, fixture, inline
from tests.contracts.hops import non_loopback_address

HOUR = 3600.0


NON_LOOPBACK = non_loopback_address()


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def server() -> Iterator[ApiServer]:
    srv = ApiServer()
    yield srv
    srv.close()


def token_file(tmp_path: Path, text: str) -> Secret:
    path = tmp_path / "token"
    path.write_text(text + "\n")
    return Secret(file=str(path))


# -- Electricity Maps ------------------------------------------------------------------------------

EM_NOW = ts("2019-05-21T00:20:00Z")


def em_routes(server: ApiServer, history: str = "em_history.json") -> None:
    server.routes.update(
        {
            "/v3/carbon-intensity/latest": Reply(body=fixture("em_latest.json")),
            "/v3/carbon-intensity/history": Reply(body=fixture(history)),
            "/v3/carbon-intensity/forecast": Reply(body=fixture("em_forecast.json")),
        }
    )


def em_source(server: ApiServer, tmp_path: Path, clock: Clock, **kw: Any) -> LiveIntensity:
    settings = ApiSettings(
        "electricity_maps", server.url + "/v3", zone="DE", secret=token_file(tmp_path, "em-secret-token"), **kw
    )
    return open_source(settings, clock=clock, spawn=inline)


def test_electricity_maps_answers_past_now_and_forecast_in_g_per_kwh(server: ApiServer, tmp_path: Path) -> None:
    em_routes(server)
    src = em_source(server, tmp_path, Clock(EM_NOW))
    assert src.at(EM_NOW) == 302  # latest: the hour from 00:00
    assert src.at(ts("2019-05-20T21:30:00Z")) == 380  # history
    assert src.at(ts("2019-05-21T02:30:00Z")) == 210  # forecast
    assert src.integral(ts("2019-05-20T22:00:00Z"), ts("2019-05-20T23:00:00Z")) == 350 * HOUR
    # Half an hour measured, half an hour forecast: the step function integrated exactly.
    assert src.integral(ts("2019-05-21T00:30:00Z"), ts("2019-05-21T01:30:00Z")) == pytest.approx(
        302 * 1800 + 326 * 1800
    )
    with pytest.raises(IntensityUnavailable, match="beyond the forecast"):
        src.at(ts("2019-05-21T04:30:00Z"))  # the forecast's last hour ends 04:00
    with pytest.raises(IntensityUnavailable, match="before the data held"):
        src.at(ts("2019-05-20T20:00:00Z"))
    assert sorted(server.paths()) == sorted(
        ["/v3/carbon-intensity/latest", "/v3/carbon-intensity/history", "/v3/carbon-intensity/forecast"]
    )
    for req in server.requests:
        assert req.headers["auth-token"] == "em-secret-token"
        assert req.query == {"zone": "DE"}


def test_a_null_hour_is_a_hole_the_fallback_answers_not_a_zero(server: ApiServer, tmp_path: Path) -> None:
    em_routes(server, history="em_history_with_null.json")
    clock = Clock(EM_NOW)
    src = em_source(server, tmp_path, clock)
    hole = ts("2019-05-20T22:30:00Z")
    with pytest.raises(IntensityUnavailable, match="no value"):
        src.at(hole)
    with pytest.raises(IntensityUnavailable, match="hole"):
        src.integral(ts("2019-05-20T21:30:00Z"), ts("2019-05-20T23:30:00Z"))
    assert src.integral(ts("2019-05-20T23:00:00Z"), ts("2019-05-21T00:30:00Z")) == 320 * HOUR + 302 * 1800
    safe = WithFallback(src, ConstantIntensity(250.0))
    assert safe.at(hole) == 250.0
    assert safe.at(ts("2019-05-20T21:30:00Z")) == 380


def test_an_answer_for_another_zone_is_refused(server: ApiServer, tmp_path: Path) -> None:
    em_routes(server)
    clock = Clock(EM_NOW)
    src = em_source(server, tmp_path, clock)
    src.settings = ApiSettings(**{**src.settings.__dict__, "zone": "FR"})
    with pytest.raises(IntensityUnavailable, match="answer for zone 'DE', asked for 'FR'"):
        src.at(EM_NOW)


def test_without_a_forecast_the_last_value_holds_until_now_and_future_times_fall_back(
    server: ApiServer, tmp_path: Path
) -> None:
    em_routes(server)
    clock = Clock(ts("2019-05-21T01:30:00Z"))  # the latest hour ended at 01:00; the next is not out yet
    src = em_source(server, tmp_path, clock, forecast=False)
    assert src.at(clock.t) == 302
    assert src.integral(ts("2019-05-21T00:30:00Z"), clock.t) == pytest.approx(302 * HOUR)
    with pytest.raises(IntensityUnavailable, match="no forecast is fetched"):
        src.at(clock.t + 600)
    assert "/v3/carbon-intensity/forecast" not in server.paths()


def test_one_fetch_per_refresh_interval_whatever_the_callers(server: ApiServer, tmp_path: Path) -> None:
    em_routes(server)
    server.routes["/v3/carbon-intensity/latest"] = Reply(body=fixture("em_latest.json"), delay_s=0.2)
    clock = Clock(EM_NOW)
    src = em_source(server, tmp_path, clock, refresh_s=300.0)
    answers: list[float] = []
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            for _ in range(20):
                answers.append(src.at(EM_NOW))
        except BaseException as err:  # collected, asserted below
            errors.append(err)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not errors and answers == [302.0] * 160
    assert len(server.requests) == 3  # latest, history, forecast: one refresh
    clock.advance(299)
    src.at(EM_NOW)
    assert len(server.requests) == 3
    clock.advance(2)
    src.at(EM_NOW)
    assert len(server.requests) == 6
    assert src.stats[:2] == (2, 0)


def test_a_due_refresh_runs_in_the_background_while_callers_get_the_held_series(
    server: ApiServer, tmp_path: Path
) -> None:
    em_routes(server)
    clock = Clock(EM_NOW)
    settings = ApiSettings("electricity_maps", server.url + "/v3", zone="DE", secret=token_file(tmp_path, "t"))
    src = open_source(settings, clock=clock)  # the real spawn: a thread per refresh
    assert src.at(EM_NOW) == 302  # the first refresh is waited for: nothing to answer with before it
    server.routes["/v3/carbon-intensity/latest"] = Reply(
        body=fixture("em_latest.json").replace(b"302", b"299"), delay_s=1.0
    )
    clock.advance(settings.refresh_s + 1)
    start = time.monotonic()
    assert src.at(EM_NOW) == 302  # held, while the provider takes its time
    assert time.monotonic() - start < 0.9
    assert src.wait_idle(10.0)
    assert src.at(EM_NOW) == 299 and src.stats == (2, 0, "")


# -- the stale rule --------------------------------------------------------------------------------

FAILURES = [
    pytest.param(Reply(500, b"internal error"), "HTTP 500: internal error", id="a 500"),
    pytest.param(Reply(403, b'{"message": "Access denied"}'), "HTTP 403", id="a 403"),
    pytest.param(Reply(429, b"rate limited"), "HTTP 429", id="a 429 (rate limit)"),
    pytest.param(Reply(200, b"<html>maintenance</html>"), "not JSON", id="malformed JSON"),
    pytest.param(
        Reply(200, b'{"zone": "DE", "datetime": "2019-05-21T01:00:00Z"}'), "carbonIntensity", id="a field missing"
    ),
    pytest.param(
        Reply(200, b'{"zone": "DE", "carbonIntensity": -3, "datetime": "2019-05-21T01:00:00Z"}'),
        ">= 0",
        id="a negative value",
    ),
    pytest.param(
        Reply(200, b'{"zone": "DE", "carbonIntensity": 5, "datetime": "yesterday"}'), "not an ISO 8601", id="a bad time"
    ),
]


@pytest.mark.parametrize(("failure", "why"), FAILURES)
def test_a_failed_refresh_serves_the_last_value_with_its_age_then_the_fallback(
    server: ApiServer, tmp_path: Path, failure: Reply, why: str
) -> None:
    em_routes(server)
    clock = Clock(EM_NOW)
    src = em_source(server, tmp_path, clock, refresh_s=600.0, max_age_s=3600.0)
    safe = WithFallback(src, ConstantIntensity(444.0, "fallback"))
    first = src.reading()
    assert (first.value, first.age, first.stale) == (302, 0.0, False)
    server.routes["/v3/carbon-intensity/latest"] = failure
    clock.advance(601)  # the refresh is due, and fails
    r = src.reading()
    assert r.value == 302 and r.stale and r.age == 601 and why in r.error
    assert safe.at(clock.t) == 302
    clock.advance(3000)  # 3601 s after the last good fetch: past max_age
    with pytest.raises(IntensityUnavailable, match="more than max_age_s 3600"):
        src.at(clock.t)
    assert safe.at(clock.t) == 444.0
    assert safe.answered_by(clock.t) == "fallback"
    server.routes["/v3/carbon-intensity/latest"] = Reply(body=fixture("em_latest.json"))
    clock.advance(601)
    r = src.reading(EM_NOW)
    assert not r.stale and r.age == 0.0 and r.error == ""


def test_nothing_fetched_yet_is_unavailable_never_zero(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v3"
    src = open_source(
        ApiSettings("electricity_maps", dead, zone="DE", secret=token_file(tmp_path, "t")), clock=Clock(EM_NOW)
    )
    with pytest.raises(IntensityUnavailable, match="no data fetched yet"):
        src.at(EM_NOW)
    assert WithFallback(src, ConstantIntensity(300.0)).at(EM_NOW) == 300.0
    assert src.age() == float("inf")


def test_an_unreadable_token_fails_the_refresh_and_names_the_file(server: ApiServer, tmp_path: Path) -> None:
    em_routes(server)
    secret = token_file(tmp_path, "t")
    Path(secret.file).unlink()
    src = open_source(
        ApiSettings("electricity_maps", server.url + "/v3", zone="DE", secret=secret), clock=Clock(EM_NOW)
    )
    with pytest.raises(IntensityUnavailable, match=f"token file {secret.file}: cannot read"):
        src.at(EM_NOW)
    assert server.requests == []


# -- deadlines -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["trickle", "hang"])
def test_a_server_that_trickles_or_hangs_cannot_hold_a_read_past_its_deadline(server: ApiServer, mode: str) -> None:
    body = fixture("em_latest.json")  # ~400 bytes at 20 bytes/s: 20 s if it were let through
    server.routes["/slow"] = Reply(body=body, mode=mode)
    start = time.monotonic()
    with pytest.raises(CarbonApiError, match=r"no complete answer within 0.5 s"):
        get_json(server.url + "/slow", {}, 0.5)
    assert time.monotonic() - start < 5.0


def test_a_refused_connection_fails_at_once_with_the_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/intensity"
    with pytest.raises(CarbonApiError, match=f"{url}: ConnectionRefusedError"):
        get_json(url, {}, 5.0)


def test_a_trickling_provider_leaves_the_source_stale_not_stuck(server: ApiServer, tmp_path: Path) -> None:
    em_routes(server)
    clock = Clock(EM_NOW)
    src = em_source(server, tmp_path, clock, refresh_s=60.0, timeout_s=0.5)
    assert src.at(EM_NOW) == 302
    server.routes["/v3/carbon-intensity/latest"] = Reply(body=fixture("em_latest.json"), mode="trickle")
    clock.advance(61)
    start = time.monotonic()
    r = src.reading()
    assert time.monotonic() - start < 5.0
    assert r.stale and r.value == 302 and "within 0.5 s" in r.error


# -- WattTime --------------------------------------------------------------------------------------

WT_NOW = ts("2024-05-01T12:01:00Z")


def wt_routes(server: ApiServer) -> None:
    server.routes.update(
        {
            "/login": Reply(body=fixture("wt_login.json")),
            "/v3/historical": Reply(body=fixture("wt_historical.json")),
            "/v3/forecast": Reply(body=fixture("wt_forecast.json")),
        }
    )


def wt_source(server: ApiServer, tmp_path: Path, clock: Clock, **kw: Any) -> WattTime:
    settings = ApiSettings(
        "watttime", server.url, zone="CAISO_NORTH", secret=token_file(tmp_path, "alice:s3cret:with:colons"), **kw
    )
    src = open_source(settings, clock=clock, spawn=inline)
    assert isinstance(src, WattTime)
    return src


def test_watttime_logs_in_with_basic_auth_and_converts_lbs_per_mwh_to_g_per_kwh(
    server: ApiServer, tmp_path: Path
) -> None:
    wt_routes(server)
    clock = Clock(WT_NOW)
    src = wt_source(server, tmp_path, clock)
    # 870 lbs/MWh × 453.59237 g/lb ÷ 1000 kWh/MWh
    assert src.at(WT_NOW) == pytest.approx(870 * 0.45359237) == pytest.approx(394.6253619)
    assert G_PER_KWH_PER_LBS_PER_MWH == 453.59237 / 1000
    assert src.at(ts("2024-05-01T11:52:00Z")) == pytest.approx(1000 * 0.45359237)  # historical
    assert src.at(ts("2024-05-01T12:07:00Z")) == pytest.approx(500 * 0.45359237)  # forecast
    assert src.integral(ts("2024-05-01T11:55:00Z"), ts("2024-05-01T12:15:00Z")) == pytest.approx(
        300 * 0.45359237 * (900 + 870 + 500 + 400)
    )
    login, *data = server.requests
    assert login.path == "/login"
    scheme, _, encoded = login.headers["Authorization"].partition(" ")
    assert scheme == "Basic" and base64.b64decode(encoded).decode() == "alice:s3cret:with:colons"
    token = '"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ1c2VyIn0.c2lnbmF0dXJl"'.strip('"')
    assert {r.path for r in data} == {"/v3/historical", "/v3/forecast"}
    for r in data:
        assert r.headers["Authorization"] == f"Bearer {token}"
        assert r.query["region"] == "CAISO_NORTH" and r.query["signal_type"] == "co2_moer"
    hist = next(r for r in data if r.path == "/v3/historical")
    assert (hist.query["start"], hist.query["end"]) == ("2024-04-30T12:01:00Z", "2024-05-01T12:01:00Z")


def test_watttime_reuses_its_token_renews_it_and_logs_in_again_on_401(server: ApiServer, tmp_path: Path) -> None:
    wt_routes(server)
    clock = Clock(WT_NOW)
    src = wt_source(server, tmp_path, clock, refresh_s=300.0)
    src.at(WT_NOW)
    clock.advance(301)
    src.at(WT_NOW)
    assert src.logins == 1  # the token lives 30 minutes
    clock.advance(25 * 60)
    src.at(WT_NOW)
    assert src.logins == 2
    expired = {"n": 0}

    def once_401(req: Any) -> Reply:
        expired["n"] += 1
        return (
            Reply(401, b'{"error": "token expired"}') if expired["n"] == 1 else Reply(body=fixture("wt_forecast.json"))
        )

    server.routes["/v3/forecast"] = once_401
    clock.advance(301)
    r = src.reading(WT_NOW)
    assert not r.stale and src.logins == 3 and expired["n"] == 2


def test_watttime_refuses_units_it_cannot_convert(server: ApiServer, tmp_path: Path) -> None:
    wt_routes(server)
    server.routes["/v3/forecast"] = Reply(
        body=fixture("wt_forecast.json").replace(b"lbs_co2_per_mwh", b"kg_co2_per_mwh")
    )
    src = wt_source(server, tmp_path, Clock(WT_NOW))
    with pytest.raises(IntensityUnavailable, match=r"meta\.units: 'kg_co2_per_mwh', expected 'lbs_co2_per_mwh'"):
        src.at(WT_NOW)


def test_watttime_bad_credentials_fail_the_refresh(server: ApiServer, tmp_path: Path) -> None:
    wt_routes(server)
    server.routes["/login"] = Reply(403, b'{"error": "invalid credentials"}')
    src = wt_source(server, tmp_path, Clock(WT_NOW))
    with pytest.raises(IntensityUnavailable, match="/login: HTTP 403"):
        src.at(WT_NOW)
    assert server.paths() == ["/login"]


# -- UK Carbon Intensity ---------------------------------------------------------------------------

UK_NOW = ts("2018-01-20T12:00:00Z")


def test_uk_national_prefers_the_actual_and_forecasts_48h_without_auth(server: ApiServer) -> None:
    server.routes.update(
        {
            r"/intensity/2018-01-19T12:00Z/2018-01-20T12:00Z": Reply(body=fixture("uk_national_past.json")),
            r"/intensity/2018-01-20T12:00Z/fw48h": Reply(body=fixture("uk_national_fw48h.json")),
        }
    )
    src = open_source(ApiSettings("uk_carbon_intensity", server.url), clock=Clock(UK_NOW))
    assert src.name == "uk_carbon_intensity national"
    assert src.at(ts("2018-01-20T11:45:00Z")) == 263  # actual 263, forecast 266
    assert src.at(UK_NOW + 60) == 266  # no actual yet: the forecast
    assert src.at(ts("2018-01-20T13:10:00Z")) == 120
    assert src.integral(ts("2018-01-20T11:00:00Z"), ts("2018-01-20T12:00:00Z")) == 270 * 1800 + 263 * 1800
    for req in server.requests:
        assert not {"authorization", "auth-token"} & {h.lower() for h in req.headers}


def test_uk_regional_by_postcode_and_by_region_id(server: ApiServer) -> None:
    server.routes.update(
        {
            r"/regional/intensity/[^/]+/[^/]+/postcode/RG10": lambda req: Reply(
                body=fixture(
                    "uk_regional_fw48h_postcode.json" if "fw48h" in req.path else "uk_regional_past_postcode.json"
                )
            ),
            r"/regional/intensity/2018-01-20T12:00Z/fw48h/regionid/3": Reply(
                body=fixture("uk_regional_fw48h_regionid.json")
            ),
        }
    )
    clock = Clock(UK_NOW)
    by_postcode = open_source(ApiSettings("uk_carbon_intensity", server.url, postcode="RG10"), clock=clock)
    assert by_postcode.at(ts("2018-01-20T11:15:00Z")) == 290
    assert by_postcode.at(ts("2018-01-20T12:45:00Z")) == 180
    assert by_postcode.name == "uk_carbon_intensity postcode RG10"
    by_region = open_source(ApiSettings("uk_carbon_intensity", server.url, region_id=3, history_hours=0), clock=clock)
    assert by_region.at(ts("2018-01-20T13:15:00Z")) == 90
    wrong = open_source(ApiSettings("uk_carbon_intensity", server.url, region_id=4, history_hours=0), clock=clock)
    server.routes[r"/regional/intensity/2018-01-20T12:00Z/fw48h/regionid/4"] = Reply(
        body=fixture("uk_regional_fw48h_regionid.json")
    )
    with pytest.raises(IntensityUnavailable, match="answer for region 3, asked for 4"):
        wrong.at(UK_NOW)


def test_live_source_is_found_inside_its_fallback(tmp_path: Path) -> None:
    src = open_source(ApiSettings("uk_carbon_intensity", "http://127.0.0.1:9"))
    assert live_source(WithFallback(src, ConstantIntensity(1.0))) is src
    assert live_source(src) is src
    assert live_source(ConstantIntensity(1.0)) is None


# -- the site file ---------------------------------------------------------------------------------


def test_a_site_file_carbon_api_with_a_fallback(server: ApiServer, tmp_path: Path) -> None:
    em_routes(server)
    (tmp_path / "em.token").write_text("file-token\n")
    doc = {
        "sites": {
            "de": {
                "carbon_api": {
                    "provider": "electricity_maps",
                    "zone": "DE",
                    "url": server.url + "/v3",
                    "token_file": "em.token",  # relative to the site file
                    "refresh_s": 300,
                    "timeout_s": 2,
                    "max_age_s": 3600,
                    "history_hours": 2,
                    "fallback": 280,
                }
            }
        }
    }
    site_path = tmp_path / "sites.yaml"
    site_path.write_text(yaml.safe_dump(doc))
    carbon = load_site_file(site_path).sites["de"].carbon
    assert isinstance(carbon, WithFallback) and carbon.fallback.at(0) == 280
    live = live_source(carbon)
    assert live is not None
    assert live.settings == ApiSettings(
        "electricity_maps",
        server.url + "/v3",
        zone="DE",
        secret=Secret(file=str(tmp_path / "em.token")),
        refresh_s=300.0,
        timeout_s=2.0,
        max_age_s=3600.0,
        history_hours=2.0,
    )
    assert server.requests == []  # loading a site file fetches nothing
    live.clock, live.spawn = Clock(EM_NOW), inline
    assert carbon.at(EM_NOW) == 302
    assert server.requests[0].headers["auth-token"] == "file-token"
    assert carbon.at(ts("2019-05-20T21:30:00Z")) == 280  # before the 2 hours of history kept: the fallback


@pytest.mark.skipif(NON_LOOPBACK is None, reason="this host has no non-loopback IPv4 address")
def test_a_credential_over_plain_http_off_loopback_is_refused_unless_the_site_file_allows_it(tmp_path: Path) -> None:
    assert NON_LOOPBACK is not None
    server = ApiServer(host=NON_LOOPBACK)
    try:
        em_routes(server)
        (tmp_path / "em.token").write_text("EM-TOKEN\n")
        body = {"provider": "electricity_maps", "zone": "DE", "url": server.url + "/v3", "token_file": "em.token"}
        site_path = tmp_path / "sites.yaml"
        site_path.write_text(yaml.safe_dump({"sites": {"de": {"carbon_api": body}}}))
        with pytest.raises(ConfigError) as info:
            load_site_file(site_path)
        assert info.value.where == str(site_path)
        assert info.value.problems == [
            f"sites.de.carbon_api.url: http:// would send the electricity_maps credential (token file"
            f" {tmp_path / 'em.token'}) in cleartext to {NON_LOOPBACK}: use https://, or set allow_plain_http: true"
            " to accept that on a network you trust (loopback needs neither)"
        ]
        site_path.write_text(yaml.safe_dump({"sites": {"de": {"carbon_api": {**body, "allow_plain_http": True}}}}))
        live = live_source(load_site_file(site_path).sites["de"].carbon)
        assert live is not None and server.requests == []
        live.clock, live.spawn = Clock(EM_NOW), inline
        assert live.at(EM_NOW) == 302
        assert server.requests[0].headers["auth-token"] == "EM-TOKEN"  # the operator's choice, on their network
        # no credential, nothing to protect: the UK API over plain http needs no opt-in
        uk = {"provider": "uk_carbon_intensity", "url": server.url}
        site_path.write_text(yaml.safe_dump({"sites": {"uk": {"carbon_api": uk}}}))
        assert live_source(load_site_file(site_path).sites["uk"].carbon) is not None
    finally:
        server.close()


def test_the_token_may_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOULESCHED_TEST_WT", "bob:pw")
    doc = {
        "sites": {
            "ca": {"carbon_api": {"provider": "watttime", "region": "CAISO_NORTH", "token_env": "JOULESCHED_TEST_WT"}}
        }
    }
    live = live_source(parse_site_document(doc, "sites.yaml").sites["ca"].carbon)
    assert live is not None and live.settings.secret == Secret(env="JOULESCHED_TEST_WT")
    assert live.settings.url == "https://api.watttime.org" and live.settings.forecast


def api(**body: Any) -> dict[str, Any]:
    return {"sites": {"north": {"carbon_api": body}}}


UK = {"provider": "uk_carbon_intensity"}

BAD_APIS = [
    pytest.param(api(provider="carbonara"), "sites.north.carbon_api.provider: must be one of electricity_maps, watttime, uk_carbon_intensity, got 'carbonara'", id="an unknown provider"),
    pytest.param(api(zone="DE"), "sites.north.carbon_api.provider: is required", id="no provider"),
    pytest.param(api(provider="electricity_maps", token_env="HOME"), "sites.north.carbon_api.zone: is required", id="Electricity Maps without a zone"),
    pytest.param(api(provider="electricity_maps", zone="DE"), "sites.north.carbon_api: electricity_maps needs a credential: token_file or token_env holding the API token", id="no credential"),
    pytest.param(api(provider="electricity_maps", zone="DE", token="abc123"), "sites.north.carbon_api.token: secrets do not go in the site file: put it in a file (token_file) or an environment variable (token_env) (docs/carbon.md, Credentials)", id="a token in clear"),
    pytest.param(api(provider="watttime", region="X", password="pw", token_env="HOME"), "sites.north.carbon_api.password: secrets do not go in the site file: put it in a file (token_file) or an environment variable (token_env) (docs/carbon.md, Credentials)", id="a password in clear"),
    pytest.param(api(provider="electricity_maps", zone="DE", token_file="missing.token"), "sites.north.carbon_api.token_file: token file", id="a token file that is not there"),
    pytest.param(api(provider="electricity_maps", zone="DE", token_env="JOULESCHED_UNSET_VARIABLE"), "sites.north.carbon_api.token_env: environment variable JOULESCHED_UNSET_VARIABLE: empty", id="an unset variable"),
    pytest.param(api(provider="watttime", region="CAISO_NORTH", token_env="HOME"), "must hold username:password", id="a WattTime secret without a user"),
    pytest.param(api(provider="electricity_maps", region="DE", zone="DE", token_env="HOME"), "sites.north.carbon_api.region: is not a field of electricity_maps (its place: zone)", id="a WattTime field for Electricity Maps"),
    pytest.param(api(**UK, token_env="HOME"), "sites.north.carbon_api.token_env: uk_carbon_intensity needs no credential", id="a credential the UK API does not take"),
    pytest.param(api(**UK, postcode="RG10", region_id=3), "sites.north.carbon_api: give postcode or region_id, not both", id="postcode and region"),
    pytest.param(api(**UK, region_id=18), "sites.north.carbon_api.region_id: must be a DNO region 1..17, got 18", id="a region id out of range"),
    pytest.param(api(**UK, postcode="RG1/0"), "sites.north.carbon_api.postcode: must be an outward postcode", id="a postcode with a slash"),
    pytest.param(api(**UK, url="ftp://proxy"), "sites.north.carbon_api.url: must be an http:// or https:// URL, got 'ftp://proxy'", id="an ftp URL"),
    pytest.param(api(**UK, url="https://u:p@proxy"), "sites.north.carbon_api.url: must not carry credentials", id="credentials in the URL"),
    pytest.param(api(**UK, allow_plain_http="yes"), "sites.north.carbon_api.allow_plain_http: must be true or false", id="allow_plain_http not a boolean"),
    pytest.param(api(**UK, refresh_s=600, max_age_s=300), "sites.north.carbon_api.max_age_s: must be >= refresh_s (600)", id="data that expires between refreshes"),
    pytest.param(api(**UK, timeout_s=0), "sites.north.carbon_api.timeout_s: must be > 0, got 0", id="a zero timeout"),
    pytest.param(api(**UK, refresh_s="15m"), "sites.north.carbon_api.refresh_s: must be a number, got string '15m'", id="a duration as a string"),
    pytest.param(api(**UK, forecast="yes"), "sites.north.carbon_api.forecast: must be true or false", id="forecast not a boolean"),
    pytest.param(api(**UK, history_hours=200), "sites.north.carbon_api.history_hours: must be <= 168, got 200", id="too much history"),
    pytest.param(api(**UK, fallback=-1), "sites.north.carbon_api.fallback: must be >= 0, got -1", id="a negative fallback"),
    pytest.param(api(**UK, refresh=60), "sites.north.carbon_api.refresh: unknown field", id="a misspelt field"),
    pytest.param(api(provider="watttime", region="R", token_env="HOME", history_hours=0, forecast=False), "leave nothing to fetch", id="WattTime with nothing to fetch"),
    pytest.param({"sites": {"north": {"carbon_api": "uk"}}}, "sites.north.carbon_api: must be a mapping, got string", id="a string for the section"),
    pytest.param({"sites": {"north": {"carbon_api": {}}}}, "sites.north.carbon_api: must name a provider", id="an empty section"),
    pytest.param({"sites": {"north": {"carbon_intensity": 50, "carbon_api": UK}}}, "sites.north: give one of carbon_intensity, carbon_series or carbon_api (with a fallback), not carbon_intensity and carbon_api", id="a constant and an API"),
    pytest.param({"sites": {"north": {"carbon_series": {"file": "c.csv"}, "carbon_api": UK}}}, "not carbon_series and carbon_api", id="a series and an API"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "message"), BAD_APIS)
def test_a_bad_carbon_api_section_is_refused_with_its_path(doc: Any, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        parse_site_document(doc, "sites.yaml", base_dir=tmp_path)
    assert any(message in p for p in info.value.problems), info.value.problems


def test_the_example_in_docs_carbon_md_is_a_valid_site_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "carbon.md").read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "em.token").write_text("t\n")
    monkeypatch.setenv("WATTTIME_CREDENTIALS", "user:pw")
    sites = parse_site_document(yaml.safe_load(example), "docs/carbon.md", base_dir=tmp_path).sites
    assert {name: type(live_source(s.carbon)).__name__ for name, s in sites.items()} == {
        "de-fra": "ElectricityMaps",
        "ca-north": "WattTime",
        "uk-south": "UkCarbonIntensity",
    }


def test_uk_forecast_is_asked_from_the_start_of_the_current_half_hour(server: ApiServer) -> None:
    server.routes[r"/intensity/2018-01-20T12:00Z/fw48h"] = Reply(body=fixture("uk_national_fw48h.json"))
    now = UK_NOW + 17 * 60  # 12:17
    src = open_source(ApiSettings("uk_carbon_intensity", server.url, history_hours=0), clock=Clock(now))
    assert src.at(now) == 266
    assert server.paths() == ["/intensity/2018-01-20T12:00Z/fw48h"]


# -- what reviews found ---------------------------------------------------------------------------


class Routes:
    """A stand-in ``get``: the first route a URL contains answers (a document, or an error raised)."""

    def __init__(self, routes: dict[str, Any]) -> None:
        self.routes, self.calls = routes, []

    def __call__(self, url: str, headers: dict[str, str], timeout: float) -> Any:
        self.calls.append(url)
        for part, answer in self.routes.items():
            if part in url:
                if isinstance(answer, Exception):
                    raise answer
                return answer
        raise CarbonApiError(f"{url}: HTTP 404", status=404)


def test_a_null_latest_hour_is_not_filled_with_the_hour_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/carbon.md: a period the provider gave no value for cannot answer; never invented."""
    monkeypatch.setenv("EM_T", "tok")
    now = ts("2019-05-21T00:20:00Z")
    latest = {"zone": "DE", "carbonIntensity": None, "datetime": "2019-05-21T00:00:00.000Z", "temporalGranularity": "hourly"}
    history = {"zone": "DE", "history": [
        {"zone": "DE", "carbonIntensity": 350, "datetime": "2019-05-20T22:00:00.000Z"},
        {"zone": "DE", "carbonIntensity": 320, "datetime": "2019-05-20T23:00:00.000Z"},
        {"zone": "DE", "carbonIntensity": None, "datetime": "2019-05-21T00:00:00.000Z"},
    ]}
    source = open_source(
        ApiSettings("electricity_maps", "http://em.invalid/v3", zone="DE", secret=Secret(env="EM_T"), forecast=False),
        clock=Clock(now), get=Routes({"latest": latest, "history": history}), spawn=inline,
    )
    assert source.at(ts("2019-05-20T23:30:00Z")) == 320
    with pytest.raises(IntensityUnavailable, match="gave no value from"):
        source.at(now)
    assert WithFallback(source, ConstantIntensity(444.0)).at(now) == 444.0


def test_after_a_failed_first_refresh_no_caller_waits_on_the_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the very first refresh is waited for: a provider down from the start does not hold a
    scrape or the deferrer's loop for its deadline at every refresh_s; the fallback answers."""
    import socket

    monkeypatch.setenv("EM_T", "tok")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # takes connections into its backlog, answers nothing
    try:
        clock = Clock(ts("2019-05-21T00:20:00Z"))
        source = open_source(
            ApiSettings("electricity_maps", f"http://127.0.0.1:{silent.getsockname()[1]}/v3", zone="DE",
                        secret=Secret(env="EM_T"), refresh_s=900.0, timeout_s=1.0),
            clock=clock,
        )
        safe = WithFallback(source, ConstantIntensity(300.0))
        assert safe.at(clock()) == 300.0  # the first refresh, waited for
        clock.t += 901
        started = time.monotonic()
        assert safe.at(clock()) == 300.0
        assert time.monotonic() - started < 0.5
        assert isinstance(source, LiveIntensity) and source.wait_idle(5.0)
    finally:
        silent.close()


def test_a_429s_retry_after_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EM_T", "tok")
    latest = {"zone": "DE", "carbonIntensity": 302, "datetime": "2019-05-21T00:00:00.000Z", "temporalGranularity": "hourly"}
    limited = CarbonApiError("em: HTTP 429: rate limited", status=429, retry_after=3600.0)
    routes = Routes({"latest": latest})
    clock = Clock(ts("2019-05-21T00:20:00Z"))
    source = open_source(
        ApiSettings("electricity_maps", "http://em.invalid/v3", zone="DE", secret=Secret(env="EM_T"),
                    refresh_s=300.0, max_age_s=7200.0, forecast=False, history_hours=0),
        clock=clock, get=routes, spawn=inline,
    )
    assert source.at(clock()) == 302 and len(routes.calls) == 1
    routes.routes["latest"] = limited
    clock.t += 301
    source.at(clock())  # due: 429, Retry-After 3600
    for _ in range(10):  # 50 minutes inside the hour asked for
        clock.t += 301
        source.at(clock())
    assert len(routes.calls) == 2, "not asked again before Retry-After"


def test_retry_after_is_read_from_the_answer(server: ApiServer) -> None:
    server.routes[r"/latest"] = Reply(429, b'{"message": "rate limited"}', headers={"Retry-After": "120"})
    with pytest.raises(CarbonApiError) as info:
        get_json(f"{server.url}/latest", {}, 5.0)
    assert (info.value.status, info.value.retry_after) == (429, 120.0)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"postcode": "RG10 1AB"}, "must be an outward postcode such as RG10 (the first half of a full one)"),
        ({"history_hours": 0, "forecast": False}, "history_hours 0 and forecast false leave nothing to fetch"),
    ],
    ids=["a full postcode", "nothing to fetch"],
)
def test_a_uk_section_that_could_never_answer_is_refused(body: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_site_document({"sites": {"uk": {"carbon_api": {"provider": "uk_carbon_intensity", **body}}}}, "sites.yaml")
    assert any(problem in p for p in info.value.problems), info.value.problems
    assert parse_site_document(
        {"sites": {"uk": {"carbon_api": {"provider": "uk_carbon_intensity", "postcode": "rg10"}}}}, "sites.yaml"
    ).sites["uk"], "an outward code, in any case"
