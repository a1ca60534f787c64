"""Helpers of the Redfish tests: a mockup server for recorded trees, certificates, the sushy emulator."""

from __future__ import annotations

import base64
import contextlib
import datetime
import http.server
import ipaddress
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.measurement.sources.ipmi_support import FIXTURES

REDFISH_FIXTURES = FIXTURES / "redfish"


class MockupServer:
    """Serves a DMTF-mockup-style tree (``<path>/index.json``) on 127.0.0.1, HTTP/1.1 keep-alive.

    ``overrides`` replaces a resource by path (to change a reading between two reads);
    ``requests`` logs every path asked for; ``connections`` counts TCP connections accepted;
    while ``silent`` is set the service accepts requests and never answers (a hung BMC).
    ``host``: the address it listens on (a non-loopback one: ``tests.contracts.hops.non_loopback_address``).
    """

    def __init__(
        self,
        tree: Path,
        *,
        credentials: tuple[str, str] | None = None,
        tls: tuple[Path, Path] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.tree = tree
        self.host = host
        self.credentials = credentials
        self.overrides: dict[str, dict[str, Any]] = {}
        self.requests: list[str] = []
        self.connections = 0
        self.silent = threading.Event()
        self._closing = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                server.connections += 1
                super().setup()

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                path = self.path.split("?")[0].split("#")[0].rstrip("/") or "/"
                server.requests.append(path)
                while server.silent.is_set() and not server._closing.is_set():
                    time.sleep(0.01)
                if server._closing.is_set():
                    return
                if server.credentials is not None and path not in ("/redfish", "/redfish/v1"):
                    expected = base64.b64encode(":".join(server.credentials).encode()).decode()
                    if self.headers.get("Authorization") != f"Basic {expected}":
                        return self.reply(
                            401,
                            {"error": {"code": "Base.1.0.NoValidSession"}},
                            {"WWW-Authenticate": 'Basic realm="mockup"'},
                        )
                if path in server.overrides:
                    return self.reply(200, server.overrides[path])
                file = server.tree / path.lstrip("/") / "index.json"
                if not file.is_file():
                    return self.reply(404, {"error": {"code": "Base.1.0.ResourceMissingAtURI"}})
                return self.reply(200, json.loads(file.read_text()))

            def reply(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a silent spell)
                    self.close_connection = True

        self.httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.scheme = "https" if tls else "http"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.httpd.server_address[1]}"

    def __enter__(self) -> MockupServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def make_ca_and_server_cert(directory: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a certificate for 127.0.0.1 signed by it: (ca.pem, server.pem, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "joulesched test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bmc.test")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca_path, cert_path, key_path


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def sushy_emulator(
    directory: Path, *, credentials: tuple[str, str] | None = None, tls: tuple[Path, Path] | None = None
) -> Iterator[str]:
    """Run the real ``sushy-emulator --fake`` on 127.0.0.1; yield its base URL."""
    import bcrypt

    config = directory / "sushy.conf"
    lines = []
    if credentials is not None:
        htpasswd = directory / "htpasswd"
        hashed = bcrypt.hashpw(credentials[1].encode(), bcrypt.gensalt(rounds=4)).decode()
        htpasswd.write_text(f"{credentials[0]}:{hashed}\n")
        lines.append(f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}")
    config.write_text("\n".join(lines) + "\n")
    port = free_tcp_port()
    argv = [
        sys.executable,
        "-m",
        "sushy_tools.emulator.main",
        "--fake",
        "--config",
        str(config),
        "-i",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    if tls is not None:
        argv += ["--ssl-certificate", str(tls[0]), "--ssl-key", str(tls[1])]
    log = directory / "sushy.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    scheme = "https" if tls else "http"
    url = f"{scheme}://127.0.0.1:{port}"
    context = ssl._create_unverified_context()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/redfish/v1/", timeout=2, context=context) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sushy-emulator did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
