"""HTTPS and mutual TLS (``server.tls``): kube-scheduler's ``enableHTTPS`` and ``tlsConfig``.

kube-scheduler's extender client sends no custom headers (``Extender`` in
kubescheduler.config.k8s.io/v1 has ``tlsConfig`` with ``certFile``/``keyFile``/``caFile`` and
nothing for a token), so a shared secret is a client certificate.
"""

from __future__ import annotations

import http.client
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml

from joulesched.extender.config import parse_config
from joulesched.extender.demo import free_port, start_extender, stop
from joulesched.policy.errors import ConfigError
from tests.extender.support import PROFILES, make_pod

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
BODY = orjson.dumps({"Pod": make_pod(), "NodeNames": ["efficient", "hungry"]})


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def ca(d: Path, name: str) -> tuple[Path, Path]:
    crt, key = d / f"{name}.crt", d / f"{name}.key"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(crt))  # fmt: skip
    return crt, key


def sign(d: Path, name: str, by: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    crt, key, csr, extfile = d / f"{name}.crt", d / f"{name}.key", d / f"{name}.csr", d / f"{name}.ext"
    extfile.write_text(ext)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
            "-keyout", str(key), "-out", str(csr))  # fmt: skip
    openssl("x509", "-req", "-in", str(csr), "-CA", str(by[0]), "-CAkey", str(by[1]), "-CAcreateserial",
            "-days", "2", "-extfile", str(extfile), "-out", str(crt))  # fmt: skip
    return crt, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    d = tmp_path_factory.mktemp("pki")
    root, other = ca(d, "root"), ca(d, "other")
    return {
        "root": root,
        "server": sign(d, "server", root, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        "scheduler": sign(d, "scheduler", root, "extendedKeyUsage=clientAuth\n"),
        "stranger": sign(d, "stranger", other, "extendedKeyUsage=clientAuth\n"),
    }


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, tuple[Path, Path]]) -> Iterator[int]:
    d = tmp_path_factory.mktemp("mtls")
    (d / "nodes.yaml").write_text(yaml.safe_dump(PROFILES))
    tls = {"cert_file": str(pki["server"][0]), "key_file": str(pki["server"][1]), "client_ca_file": str(pki["root"][0])}
    (d / "config.yaml").write_text(
        yaml.safe_dump({"profiles": {"file": {"path": "nodes.yaml"}}, "server": {"tls": tls}})
    )
    port = free_port()
    proc = start_extender(d / "config.yaml", port, d / "extender.log")
    try:
        wait_tls_ready(port, pki)
        yield port
    finally:
        stop(proc)


def context(pki: dict[str, tuple[Path, Path]], client: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["root"][0]))
    if client:
        ctx.load_cert_chain(str(pki[client][0]), str(pki[client][1]))
    return ctx


def wait_tls_ready(port: int, pki: dict[str, tuple[Path, Path]]) -> None:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if get(port, context(pki, None), "/readyz")[0] == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the extender did not come up over TLS")


def get(port: int, ctx: ssl.SSLContext, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def prioritize(port: int, ctx: ssl.SSLContext) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
    try:
        conn.request("POST", "/scheduler/prioritize", BODY, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def test_the_scheduler_s_certificate_is_served(mtls: int, pki: dict[str, tuple[Path, Path]]) -> None:
    ctx = context(pki, "scheduler")
    conn = http.client.HTTPSConnection("127.0.0.1", mtls, context=ctx, timeout=5)
    for _ in range(3):  # kept alive over TLS
        conn.request("POST", "/scheduler/prioritize", BODY, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        assert reply.status == 200 and orjson.loads(reply.read())[0]["Host"] == "efficient"
    conn.close()


def test_no_certificate_is_403_on_the_verbs_but_probes_and_metrics_answer(
    mtls: int, pki: dict[str, tuple[Path, Path]]
) -> None:
    ctx = context(pki, None)
    status, body = prioritize(mtls, ctx)
    assert status == 403 and "client certificate" in orjson.loads(body)["Error"]
    assert get(mtls, ctx, "/healthz")[0] == 200 and get(mtls, ctx, "/readyz")[0] == 200
    status, text = get(mtls, ctx, "/metrics")
    assert (
        status == 200 and b'joulesched_extender_failures_total{reason="no_client_certificate",verb="http"} 1.0' in text
    )


def test_a_certificate_from_another_ca_is_refused_at_the_handshake(
    mtls: int, pki: dict[str, tuple[Path, Path]]
) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError)):
        prioritize(mtls, context(pki, "stranger"))
    assert prioritize(mtls, context(pki, "scheduler"))[0] == 200  # and the server is still fine


def test_tls_config_rules(tmp_path: Path) -> None:
    base = {"profiles": {"file": {"path": "x.yaml"}}}
    with pytest.raises(ConfigError, match="cert_file and key_file go together"):
        parse_config({**base, "server": {"tls": {"cert_file": "a.pem"}}}, "t", tmp_path)
    with pytest.raises(ConfigError, match="mutual TLS is TLS first"):
        parse_config({**base, "server": {"tls": {"client_ca_file": "ca.pem"}}}, "t", tmp_path)
    with pytest.raises(ConfigError, match=r"server\.worker must be buffered"):
        tls = {"cert_file": "a.pem", "key_file": "k.pem", "client_ca_file": "ca.pem"}
        parse_config({**base, "server": {"worker": "gthread", "tls": tls}}, "t", tmp_path)
    key = tmp_path / "keys" / "k.pem"
    with pytest.raises(ConfigError) as missing:  # read before gunicorn starts, which would give a traceback
        parse_config({**base, "server": {"tls": {"cert_file": "a.pem", "key_file": str(key)}}}, "t", tmp_path)
    assert missing.value.problems == [
        f"server.tls.cert_file: {tmp_path / 'a.pem'}: cannot read: No such file or directory",
        f"server.tls.key_file: {key}: cannot read: No such file or directory",
    ]
    key.parent.mkdir()
    key.write_text("key")
    (tmp_path / "a.pem").write_text("cert")
    config = parse_config({**base, "server": {"tls": {"cert_file": "a.pem", "key_file": str(key)}}}, "t", tmp_path)
    assert config.server.tls_cert_file == str(tmp_path / "a.pem") and config.server.tls_key_file == str(key)
