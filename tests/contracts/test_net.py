"""contracts.net's credential rules, with real urllib requests between loopback servers: a
redirect to another origin gets no credential, a URL may not carry one, and a credential goes over
plain http only to loopback or by the config's explicit ``allow_plain_http: true``."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from joulesched.contracts.errors import NadikiReadError
from joulesched.contracts.nadiki_read import InfluxReader, RegistrarReader
from joulesched.contracts.net import is_loopback_host, open_url, origin, plain_http_problem, redact, url_problem
from tests.contracts.hops import Hop, to

SECRET_HEADERS = {"Authorization": "Bearer SECRET", "Cookie": "session=SECRET", "auth-token": "SECRET"}


def fetch(url: str, headers: dict[str, str]) -> bytes:
    with open_url(urllib.request.Request(url, headers=headers), timeout=5) as reply:
        return bytes(reply.read())


def test_a_redirect_to_another_origin_carries_no_credential_header() -> None:
    with Hop() as other, Hop(to(other)) as first:
        fetch(first.url + "/a", {**SECRET_HEADERS, "Accept": "application/json"})
        assert [s.path for s in other.seen] == ["/a"]
        assert first.seen[0].credentials == {"Authorization": "Bearer SECRET", "Cookie": "session=SECRET", "auth-token": "SECRET"}
        assert other.seen[0].credentials == {}  # urllib's own handler sent all three


def test_a_redirect_within_the_origin_keeps_them_and_a_detour_does_not_bring_them_back() -> None:
    with Hop(lambda path: None if path.startswith("/moved") else "/moved" + path) as same:
        fetch(same.url + "/a", {"Authorization": "Bearer SECRET"})
        assert [(s.path, s.credentials) for s in same.seen] == [
            ("/a", {"Authorization": "Bearer SECRET"}),
            ("/moved/a", {"Authorization": "Bearer SECRET"}),
        ]
    with Hop() as away, Hop(lambda path: away.url + path if path == "/a" else None) as start:
        away.redirect = lambda path: start.url + "/back"
        fetch(start.url + "/a", {"Authorization": "Bearer SECRET"})
        assert [(s.path, s.credentials) for s in start.seen] == [("/a", {"Authorization": "Bearer SECRET"}), ("/back", {})]
        assert away.seen[0].credentials == {}


def test_the_same_origin_is_scheme_host_and_port_with_defaults_filled_in() -> None:
    assert origin("http://Bmc.Example/a") == origin("http://bmc.example:80/b") == ("http", "bmc.example", 80)
    assert origin("https://bmc.example/") != origin("http://bmc.example/")
    assert origin("https://bmc.example:8443/") != origin("https://bmc.example/")


def test_the_nadiki_readers_do_not_follow_a_redirect_with_their_credentials() -> None:
    with Hop() as other, Hop(to(other)) as first:
        with pytest.raises(NadikiReadError):
            RegistrarReader(first.url + "/v1", token="REGISTRAR-TOKEN").server("S1")
        with pytest.raises(NadikiReadError):
            InfluxReader(first.url, "db", "tenant", "INFLUX-PASSWORD").query("SELECT 1")
        assert [s.credentials for s in first.seen] == [
            {"Authorization": "Bearer REGISTRAR-TOKEN"},
            {"Authorization": "Basic dGVuYW50OklORkxVWC1QQVNTV09SRA=="},
        ]
        assert [s.path for s in other.seen] == ["/v1/servers/S1", "/query?db=db&q=SELECT+1&epoch=ms"]
        assert [s.credentials for s in other.seen] == [{}, {}]


def test_the_nadiki_readers_refuse_a_url_with_credentials_without_repeating_them() -> None:
    for make in (
        lambda: RegistrarReader("https://reader:REGISTRAR-TOKEN@registry.example/v1"),
        lambda: InfluxReader("https://tenant:INFLUX-PASSWORD@influx.example", "db"),
    ):
        with pytest.raises(ValueError, match="URL must not carry credentials") as info:
            make()
        assert "REGISTRAR-TOKEN" not in str(info.value) and "INFLUX-PASSWORD" not in str(info.value)
    assert "INFLUX-PASSWORD" not in repr(InfluxReader("https://influx.example", "db", "tenant", "INFLUX-PASSWORD"))


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://bmc.example", None),
        ("http://bmc.example:8000/redfish", None),
        ("https://user:SECRET@bmc.example", "must not carry credentials"),
        ("https://SECRET@bmc.example", "must not carry credentials"),
        ("ftp://user:SECRET@bmc.example", "must not carry credentials"),
        ("https://user:SECRET@bmc.example:port", "must not carry credentials"),
        # a password with / ? # in it ends urlsplit's netloc early: still credentials, never repeated
        ("https://admin:SEC/RET@bmc.example", "must not carry credentials"),
        ("https://admin:9000/SECRET@bmc.example", "must not carry credentials"),
        ("https://admin:SEC?RET@bmc.example", "must not carry credentials"),
        ("https://admin:SEC#RET@bmc.example", "must not carry credentials"),
        ("https://bmc.example/x?mail=a@b", None),  # an @ in the query is not user information
        ("https://bmc.example:port", "is not a URL ('https://bmc.example:port')"),
        ("ftp://bmc.example", "must be an http:// or https:// URL, got 'ftp://bmc.example'"),
        ("bmc.example:443", "must be an http:// or https:// URL"),
        ("http://[::1", "is not a URL"),
    ],
)
def test_url_problem(url: str, problem: str | None) -> None:
    found = url_problem(url, "password_file")
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found and "SECRET" not in found and "SEC" not in found


def test_plain_http_is_for_loopback_or_an_explicit_opt_in() -> None:
    assert plain_http_problem("https://bmc.example", "the password", False) is None
    assert plain_http_problem("http://bmc.example", "the password", True) is None
    for host in ("127.0.0.1", "127.1.2.3", "[::1]", "localhost", "LOCALHOST"):
        assert plain_http_problem(f"http://{host}:8000", "the password", False) is None, host
    assert plain_http_problem("http://10.0.0.7", "the password", False, "nadiki.allow_plain_http") == (
        "http:// would send the password in cleartext to 10.0.0.7: use https://, or set"
        " nadiki.allow_plain_http: true to accept that on a network you trust (loopback needs neither)"
    )
    assert not is_loopback_host("127.0.0.1.example") and not is_loopback_host("::ffff:10.0.0.1")
    assert redact("https://u:SECRET@h:1/p?q=1") == "https://h:1/p?q=1"


def test_open_url_answers_and_fails_as_urlopen_does() -> None:
    with Hop(body={"ok": True}) as hop:
        assert fetch(hop.url + "/x", {}) == b'{"ok": true}'
    with Hop(lambda path: "/loop" + path, code=302) as loop:  # a redirect loop ends in urllib's HTTPError
        with pytest.raises(urllib.error.HTTPError):
            fetch(loop.url + "/x", {})
