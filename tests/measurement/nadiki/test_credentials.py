"""Provider mode's credentials: the registrar token and the time-series token go to the origin they
were configured for (a redirect elsewhere is followed without them), never over plain http off
loopback unless ``nadiki.allow_plain_http: true``, and never into a repr."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from joulesched.measurement.nadiki import Provider, RegistrationFailed
from joulesched.measurement.nadiki.errors import PushFailed
from joulesched.measurement.nadiki.model import TimeSeriesConfig
from joulesched.measurement.nadiki.pusher import InfluxWriter
from joulesched.measurement.nadiki.registrar import RegistrarClient
from joulesched.measurement.sources.base import Roots
from tests.contracts.hops import Hop, to
from tests.measurement.nadiki.nadiki_support import RegistrarServer, needs_spec
from tests.measurement.nadiki.test_registration import provider_config


def test_a_redirect_to_another_origin_gets_no_registrar_token() -> None:
    with Hop() as other, Hop(to(other)) as registrar:
        client = RegistrarClient(registrar.url + "/v1", token="REGISTRAR-TOKEN")
        with pytest.raises(RegistrationFailed):
            client.get("S1")
        with pytest.raises(RegistrationFailed):
            client.create({"facility_id": "F", "rack_id": "R"})  # a POST answered 302: urllib goes on with a GET
        assert [s.credentials for s in registrar.seen] == [{"Authorization": "Bearer REGISTRAR-TOKEN"}] * 2
        assert [(s.method, s.path, s.credentials) for s in other.seen] == [
            ("GET", "/v1/servers/S1", {}),
            ("GET", "/v1/servers", {}),
        ]


def test_a_redirected_write_gets_no_time_series_token() -> None:
    with Hop() as other, Hop(to(other)) as endpoint:
        writer = InfluxWriter(TimeSeriesConfig(endpoint.url, "org", "bucket", "INFLUX-TOKEN", ()))
        try:
            writer.write(["server server_energy_consumption_joules=1.0 1767268830"])
        except PushFailed:
            pass
        assert endpoint.seen[0].credentials == {"Authorization": "Token INFLUX-TOKEN"}
        assert [(s.method, s.credentials) for s in other.seen] == [("GET", {})]


def test_the_registrar_token_is_not_in_the_clients_repr() -> None:
    client = RegistrarClient("https://registry.example/v1", token="REGISTRAR-TOKEN")
    assert "REGISTRAR-TOKEN" not in repr(client)
    assert "registry.example" in repr(client)


@needs_spec
def test_a_time_series_endpoint_over_plain_http_off_loopback_is_refused_unless_allowed(tmp_path: Path) -> None:
    with RegistrarServer() as server:
        server.state.endpoint = "http://influx.example:8086"
        config = provider_config(server, tmp_path / "s.json", discover=False)
        with pytest.raises(RegistrationFailed) as info:
            Provider(config, Roots()).register()
        message = str(info.value)
        assert f"NADIKI registrar {server.registrar_url}: the time-series endpoint it names" in message
        assert "(timeSeriesConfig.endpoint http://influx.example:8086) http:// would send the time-series token" in message
        assert "set nadiki.allow_plain_http: true" in message and server.state.token not in message
        registration = Provider(replace(config, allow_plain_http=True), Roots()).register()
        assert registration.time_series.endpoint == "http://influx.example:8086"
        server.state.endpoint = "https://tenant:INFLUX-PASSWORD@influx.example"
        server.state.servers.clear()
        with pytest.raises(RegistrationFailed, match="must not carry credentials") as info:
            Provider(replace(config, allow_plain_http=True), Roots()).register()
        assert "INFLUX-PASSWORD" not in str(info.value)
