"""extender/kube.py: the binder's API client follows its credentials as they are rotated.

The kubernetes client reads a kubeconfig's ``tokenFile`` and its inline certificates once, when
it is made. The binder makes it again after a 401 (and sends the refused binding once more when
the new client has other credentials), after a TLS failure, and when a file it was made from
has changed (looked at every ``TOKEN_SECONDS``, not at each binding). Against a loopback server
that checks the credentials as kube-apiserver does; the real kube-apiserver's replies are in
tests/e2e/test_extender_e2e.py.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from joulesched.extender import kube
from joulesched.extender.errors import ExtenderError
from joulesched.extender.kube import Binder
from joulesched.extender.wire import BindingArgs

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy")


@pytest.fixture(autouse=True)
def no_proxy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubernetes client's Configuration reads the proxy variables: these tests set their own."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


class Api:
    """A loopback API server that creates bindings for the credentials it accepts and answers
    401 to any other, over kept-alive HTTP/1.1 connections (TLS with ``tls``).

    ``tokens``: the bearer tokens it accepts; ``subjects``: the client certificates' common
    names it accepts. It records each binding request as (Authorization, certificate CN).
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tokens: set[str] = set()
        self.subjects: set[str] = set()
        self.seen: list[tuple[str | None, str | None]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                auth = self.headers.get("Authorization")
                cert = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
                cn = next((v for rdn in (cert or {}).get("subject", ()) for k, v in rdn if k == "commonName"), None)
                api.seen.append((auth, cn))
                ok = (auth or "").removeprefix("Bearer ") in api.tokens or cn in api.subjects
                code, status = (201, {"kind": "Status", "status": "Success", "code": 201}) if ok else (
                    401, {"kind": "Status", "status": "Failure", "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
                body = json.dumps(status).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api() -> Iterator[Api]:
    server = Api()
    yield server
    server.close()


def write_kubeconfig(path: Path, server: str, user: dict[str, str], cluster: dict[str, str] | None = None) -> Path:
    """Write a kubeconfig as a kubelet or a Secret's volume does: a new file put in place."""
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    replace(path, yaml.safe_dump(doc))
    return path


def replace(path: Path, text: str) -> None:
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


def bind(binder: Binder, name: str) -> None:
    binder(BindingArgs(name, "ns", "", "node-a"))


def test_a_token_file_rotated_and_its_old_token_revoked_binds_with_the_new_token_at_once(api: Api, tmp_path: Path) -> None:
    # Before, the binder asked the same client for its token after the 401, and a kubeconfig's
    # client reads its tokenFile once: every binding failed until the extender restarted.
    token = tmp_path / "token"
    replace(token, "old")
    api.tokens = {"old"}
    binder = Binder(str(write_kubeconfig(tmp_path / "kubeconfig", api.url, {"tokenFile": "token"})))  # relative to the kubeconfig
    binder.TOKEN_SECONDS = 3600.0  # the files are not looked at again here: only the 401 says
    bind(binder, "a")
    replace(token, "new")  # the kubelet rotates the projected token...
    api.tokens = {"new"}  # ...and the old one is revoked (its bound object deleted)
    bind(binder, "b")  # refused once, sent again with the client made again: bound
    bind(binder, "c")
    assert [auth for auth, _ in api.seen] == ["Bearer old", "Bearer old", "Bearer new", "Bearer new"]


def test_a_401_with_credentials_that_did_not_change_is_not_sent_again(api: Api, tmp_path: Path) -> None:
    api.tokens = {"s3cret"}
    binder = Binder(str(write_kubeconfig(tmp_path / "kubeconfig", api.url, {"token": "s3cret"})))
    binder.TOKEN_SECONDS = 3600.0
    bind(binder, "a")
    client = binder._api()
    api.tokens = set()  # revoked, and nothing new to send
    for name in ("b", "c"):
        with pytest.raises(ExtenderError, match=r"^HTTP 401: Unauthorized$"):
            bind(binder, name)
    assert [auth for auth, _ in api.seen] == ["Bearer s3cret"] * 3  # one POST a binding: none sent twice
    assert binder._api() is not client  # made again from the kubeconfig after the 401


@pytest.mark.parametrize("rotated", ["tokenFile", "kubeconfig"])
def test_credentials_rotated_while_the_old_ones_still_work_are_sent_once_TOKEN_SECONDS_have_passed(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rotated: str
) -> None:
    # A projected token is replaced at 80 % of its lifetime, the old one still valid: no 401
    # says so, the binder sees the file changed when it next asks for its token.
    now = [1000.0]
    monkeypatch.setattr(kube.time, "monotonic", lambda: now[0])
    stats: list[str | None] = []
    file_stamp = kube._file_stamp

    def counted(path: str | None) -> Any:
        stats.append(path)
        return file_stamp(path)

    monkeypatch.setattr(kube, "_file_stamp", counted)
    token, kubeconfig = tmp_path / "token", tmp_path / "kubeconfig"
    replace(token, "old")
    api.tokens = {"old", "new"}
    write_kubeconfig(kubeconfig, api.url, {"tokenFile": str(token)})
    binder = Binder(str(kubeconfig))
    bind(binder, "a")
    made = len(stats)
    assert made == 2  # the kubeconfig and its tokenFile, stamped as the client was made
    if rotated == "tokenFile":
        replace(token, "new")
    else:
        write_kubeconfig(kubeconfig, api.url, {"token": "new"})
    for name in "bcd":
        bind(binder, name)
    assert len(stats) == made  # within TOKEN_SECONDS of the token, no file is looked at
    now[0] += binder.TOKEN_SECONDS
    bind(binder, "e")
    bind(binder, "f")
    assert [auth for auth, _ in api.seen] == ["Bearer old"] * 4 + ["Bearer new"] * 2


def test_a_kubeconfig_written_half_way_keeps_the_client_in_use_and_is_read_once_whole(api: Api, tmp_path: Path) -> None:
    api.tokens = {"old", "new"}
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, {"token": "old"})
    binder = Binder(str(kubeconfig))
    binder.TOKEN_SECONDS = 0.0  # each binding looks at the files
    bind(binder, "a")
    replace(kubeconfig, "apiVersion: v1\nclusters: [")
    bind(binder, "b")  # the old client binds on
    write_kubeconfig(kubeconfig, api.url, {"token": "new"})
    bind(binder, "c")
    assert [auth for auth, _ in api.seen] == ["Bearer old", "Bearer old", "Bearer new"]


def test_a_401_when_the_client_cannot_be_made_again_names_the_kubeconfig(api: Api, tmp_path: Path) -> None:
    api.tokens = {"old"}
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, {"token": "old"})
    binder = Binder(str(kubeconfig))
    binder.TOKEN_SECONDS = 3600.0
    bind(binder, "a")
    api.tokens = set()
    kubeconfig.unlink()
    with pytest.raises(ExtenderError, match=rf"^binder: cannot make the API client from {kubeconfig}: "):
        bind(binder, "b")
    api.tokens = {"new"}
    write_kubeconfig(kubeconfig, api.url, {"token": "new"})
    bind(binder, "c")  # made at this binding
    assert [auth for auth, _ in api.seen] == ["Bearer old", "Bearer old", "Bearer new"]


def b64(path: Path) -> str:
    return base64.standard_b64encode(path.read_bytes()).decode()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI")
    from tests.extender.test_tls import ca, sign

    d = tmp_path_factory.mktemp("binder-pki")
    root, other = ca(d, "root"), ca(d, "other")
    client = "extendedKeyUsage=clientAuth\n"
    return {
        "root": root,
        "other": other,
        "server": sign(d, "server", root, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        "old-client": sign(d, "old-client", root, client),
        "new-client": sign(d, "new-client", root, client),
    }


def tls_api(pki: dict[str, tuple[Path, Path]]) -> Api:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*pki["server"])
    ctx.load_verify_locations(pki["root"][0])
    ctx.verify_mode = ssl.CERT_OPTIONAL  # as kube-apiserver: a certificate it does not accept is a 401, not a failed handshake
    return Api(ctx)


def test_a_client_certificate_rewritten_in_the_kubeconfig_binds_at_once_after_the_401(
    pki: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    api = tls_api(pki)
    try:
        api.subjects = {"old-client"}
        kubeconfig = tmp_path / "kubeconfig"
        ca = {"certificate-authority-data": b64(pki["root"][0])}

        def with_client(name: str) -> None:
            crt, key = pki[name]
            write_kubeconfig(kubeconfig, api.url, {"client-certificate-data": b64(crt), "client-key-data": b64(key)}, ca)

        with_client("old-client")
        binder = Binder(str(kubeconfig))
        binder.TOKEN_SECONDS = 3600.0
        bind(binder, "a")
        with_client("new-client")  # the certificate renewed, inline in the kubeconfig
        api.subjects = {"new-client"}  # the old one no longer accepted
        bind(binder, "b")
        assert [cn for _, cn in api.seen] == ["old-client", "old-client", "new-client"]
    finally:
        api.close()


def test_a_tls_failure_makes_the_client_again_at_the_next_binding(pki: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    # The kubeconfig's inline CA is rotated to the API server's new one: the stale client
    # refuses the server; the next binding's client, made again, trusts it. (The files are
    # looked at only every TOKEN_SECONDS: here never, so the TLS failure is what says so.)
    api = tls_api(pki)
    try:
        api.tokens = {"t"}
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(kubeconfig, api.url, {"token": "t"}, {"certificate-authority-data": b64(pki["other"][0])})
        binder = Binder(str(kubeconfig))
        binder.TOKEN_SECONDS = 3600.0
        with pytest.raises(ssl.SSLCertVerificationError):
            bind(binder, "a")  # never sent: no binding to send again
        write_kubeconfig(kubeconfig, api.url, {"token": "t"}, {"certificate-authority-data": b64(pki["root"][0])})
        bind(binder, "b")
        assert [auth for auth, _ in api.seen] == ["Bearer t"]
    finally:
        api.close()


def test_concurrent_401s_make_the_client_again_once(api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "token"
    replace(token, "old")
    api.tokens = {"old"}
    binder = Binder(str(write_kubeconfig(tmp_path / "kubeconfig", api.url, {"tokenFile": str(token)})))
    binder.TOKEN_SECONDS = 3600.0
    bind(binder, "warm")
    makes: list[int] = []
    make = binder._make

    def counted() -> Any:
        makes.append(1)
        return make()

    monkeypatch.setattr(binder, "_make", counted)
    replace(token, "new")
    api.tokens = {"new"}
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def run(i: int) -> None:
        start.wait()
        try:
            bind(binder, f"p{i}")
        except BaseException as err:  # pragma: no cover - the assertion below names it
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == [] and len(makes) == 1
    assert sum(auth == "Bearer new" for auth, _ in api.seen) == 8
