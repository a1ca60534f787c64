"""extender/kube.py: ApiConnections, the binder's HTTP/1.1 client, against a scripted server.

The real kube-apiserver's replies (TLS, client certificates, bearer tokens, its refusals) are
in tests/e2e/test_extender_e2e.py; here the server sends what a test tells it to, byte for
byte, so that every way an HTTP/1.1 reply may come (and break) is exercised.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from joulesched.extender.errors import ExtenderError
from joulesched.extender.kube import ApiConnections

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy")


@pytest.fixture(autouse=True)
def no_proxy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubernetes client's Configuration reads the proxy variables: these tests set their own."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


OK = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n" b'{"status":"fine"}'


class Scripted:
    """A loopback server answering each request with the next reply of ``replies``.

    A reply is bytes to send, or a callable given the connection (to send in pieces, close,
    or stay silent). It records each request it read (head and body) and each connection.
    """

    def __init__(self, replies: list[bytes | Callable[[socket.socket], None]], tls: ssl.SSLContext | None = None) -> None:
        self.replies = list(replies)
        self.tls = tls  # TLS with this context for each connection accepted from now on
        self.requests: list[bytes] = []
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except (OSError, ssl.SSLError):
                    conn.close()  # the client refused the certificate
                    continue
            self.sockets.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
                while len(buf) < length:
                    buf += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + buf[:length])
                buf = buf[length:]
                reply = self.replies.pop(0)
                if callable(reply):
                    reply(conn)
                else:
                    conn.sendall(reply)
        except OSError:
            return

    def close(self) -> None:
        self.listener.close()
        for s in self.sockets:
            s.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[Scripted, ApiConnections]]]:
    made: list[tuple[Scripted, ApiConnections]] = []

    def make(replies: list[Any], timeout: float = 5.0, prefix: str = "") -> tuple[Scripted, ApiConnections]:
        server = Scripted(replies)
        config = SimpleNamespace(host=f"http://127.0.0.1:{server.port}{prefix}", tls_server_name=None, ssl_ca_cert=None,
                                 verify_ssl=True, cert_file=None, key_file=None)
        made.append((server, ApiConnections(config, timeout)))
        return made[-1]

    yield make
    for server, conns in made:
        conns.close()
        server.close()


def post(conns: ApiConnections, body: bytes = b'{"kind":"Binding"}') -> tuple[int, bytes]:
    return conns.post("/api/v1/namespaces/ns/pods/p/binding", {"Content-Type": "application/json", "Authorization": "Bearer t"}, body)


def test_a_post_is_one_request_and_its_connection_is_kept_for_the_next(serve) -> None:  # type: ignore[no-untyped-def]
    server, conns = serve([OK, OK], prefix="/k8s/")
    assert post(conns) == (201, b'{"status":"fine"}')
    assert post(conns, b"{}") == (201, b'{"status":"fine"}')
    assert server.connections == 1
    first = server.requests[0]
    assert first == (
        b"POST /k8s/api/v1/namespaces/ns/pods/p/binding HTTP/1.1\r\n"
        + f"Host: 127.0.0.1:{server.port}\r\n".encode()
        + b'Content-Type: application/json\r\nAuthorization: Bearer t\r\nContent-Length: 18\r\n\r\n{"kind":"Binding"}'
    )
    assert server.requests[1].endswith(b"Content-Length: 2\r\n\r\n{}")


def test_a_chunked_reply_sent_in_pieces_is_read_whole_with_its_trailers(serve) -> None:  # type: ignore[no-untyped-def]
    reply = b"HTTP/1.1 409 Conflict\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: y\r\n\r\n"

    def in_pieces(conn: socket.socket) -> None:
        for i in range(0, len(reply), 7):
            conn.sendall(reply[i : i + 7])
            time.sleep(0.002)

    server, conns = serve([in_pieces, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"])
    assert post(conns) == (409, b"hello world")
    assert post(conns) == (200, b"")
    assert server.connections == 1


def test_a_reply_that_closes_or_a_server_that_closed_the_idle_connection_costs_a_new_connection(serve) -> None:  # type: ignore[no-untyped-def]
    closed = threading.Event()

    def then_close(conn: socket.socket) -> None:
        conn.sendall(OK)
        conn.close()
        closed.set()

    def to_the_end(conn: socket.socket) -> None:  # no length: the body runs to the end of the connection
        conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nto the end")
        conn.close()

    server, conns = serve([OK.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1), then_close, OK, to_the_end, OK])
    assert post(conns)[0] == 201
    assert post(conns)[0] == 201  # on a new connection: the last reply said close
    assert closed.wait(5)
    assert post(conns)[0] == 201  # the server closed the idle one after replying: found, and replaced
    assert server.connections == 3
    assert post(conns) == (200, b"to the end")  # on the third connection, which is then not kept
    assert post(conns)[0] == 201
    assert server.connections == 4


def test_replies_without_a_body_interim_replies_and_http_1_0_framing_are_read_as_http_says(serve) -> None:  # type: ignore[no-untyped-def]
    server, conns = serve([
        b"HTTP/1.1 204 No Content\r\nContent-Length: 99\r\n\r\n",  # 204: no body, whatever the length says
        b"HTTP/1.1 100 Continue\r\n\r\n" + OK,  # an interim reply, then the reply
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",  # HTTP/1.0: closed after, unless it says keep-alive
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
        OK.replace(b"\r\n\r\n", b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n", 1).replace(b"Content-Length: 17\r\n", b"").replace(
            b'{"status":"fine"}', b'11\r\n{"status":"fine"}\r\n0\r\n\r\n'),
        OK,
    ])
    assert post(conns) == (204, b"")
    assert post(conns) == (201, b'{"status":"fine"}')
    assert server.connections == 1
    assert post(conns) == (200, b"ok")
    assert post(conns) == (200, b"ok")  # on a second connection, kept for the next
    assert server.connections == 2
    assert post(conns) == (201, b'{"status":"fine"}')  # chunked, then closed
    assert post(conns)[0] == 201
    assert server.connections == 3


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP/1.x reply from the API server: b'SSH-2.0-OpenSSH_9.2'"),
        (b"HTTP/1.1 2010 Created\r\n\r\n", "not an HTTP/1.x reply"),
        (b"HTTP/1.1 201 Created\r\nContent-Length: 1e3\r\n\r\n", "Content-Length b'1e3'"),
        (b"HTTP/1.1 201 Created\r\nContent-Length: 2000000\r\n\r\n", "reply body of 2000000 bytes is over 1048576"),
        (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size b'zz'"),
        (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd\r\n", "chunk not ended by CRLF"),
        (b"HTTP/1.1 201 Created\r\nX: " + b"x" * 70000, "reply head is over 65536 bytes"),
        (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n" + b"0" * 70000, "chunk size line that does not end"),
        (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: " + b"x" * 70000, "trailers are over 65536 bytes"),
    ],
    ids=["not HTTP", "a four-digit status", "a length not a number", "a body too large", "a chunk size not hex",
         "a chunk longer than it said", "a head that never ends", "a chunk size that never ends", "trailers that never end"],
)
def test_a_reply_that_is_not_http_or_breaks_its_own_framing_is_refused_by_name(serve, reply, message) -> None:  # type: ignore[no-untyped-def]
    server, conns = serve([reply, OK])
    with pytest.raises(ExtenderError, match=message.replace("(", r"\(").replace(")", r"\)")):
        post(conns)
    assert post(conns)[0] == 201 and server.connections == 2  # the broken connection was not kept


def test_a_connection_closed_mid_reply_or_a_silent_server_fails_the_post_within_its_timeout(serve) -> None:  # type: ignore[no-untyped-def]
    def half(conn: socket.socket) -> None:
        conn.sendall(OK[:-5])
        conn.close()

    _, conns = serve([half], timeout=0.5)
    with pytest.raises(ExtenderError, match="closed the connection before the end of its reply"):
        post(conns)
    _, silent = serve([lambda conn: None], timeout=0.3)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        post(silent)
    assert time.monotonic() - started < 2


def test_a_reply_trickled_byte_by_byte_fails_the_post_within_its_timeout(serve) -> None:  # type: ignore[no-untyped-def]
    # Each byte comes well within the timeout, the whole reply not: the timeout bounds the
    # reply, so a bind thread is not held for as long as a server (or a proxy) takes.
    def trickle(conn: socket.socket) -> None:
        for byte in OK:
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                return
            time.sleep(0.05)

    _, conns = serve([trickle], timeout=0.5)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        post(conns)
    assert time.monotonic() - started < 1.0


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(serve) -> None:  # type: ignore[no-untyped-def]
    server, conns = serve([OK])
    with pytest.raises(ExtenderError, match="the Authorization header for the API server holds a line break"):
        conns.post("/x", {"Authorization": "Bearer t\r\nX-Admin: yes"}, b"{}")
    assert server.connections == 0 and not server.requests


@pytest.mark.parametrize(
    ("changes", "covered"),
    [({}, True), ({"host": "http://127.0.0.1:8080"}, True), ({"proxy": "http://proxy:3128"}, False),
     ({"assert_hostname": "kubernetes"}, False), ({"socket_options": [(6, 1, 1)]}, False), ({"keep_alive": True}, False),
     ({"host": "unix:///run/api.sock"}, False), ({"proxy": "http://proxy:3128", "no_proxy": "10.0.0.0/8"}, True)],
    ids=["https", "http", "a proxy", "assert_hostname", "socket options", "TCP keep-alive", "another scheme",
         "a proxy the API server bypasses"],
)
def test_only_configurations_set_up_exactly_as_the_kubernetes_client_would_are_covered(changes: dict[str, Any], covered: bool) -> None:
    from kubernetes import client

    config = client.Configuration(host="https://10.0.0.1:6443")
    for key, value in changes.items():
        setattr(config, key, value)
    assert ApiConnections.covers(config) is covered


def token_kubeconfig(tmp_path: Any, port: int, token: str) -> Any:
    """A kubeconfig for an API server on loopback ``port``, with a bearer token."""
    import yaml

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))
    return kubeconfig


def test_the_binder_posts_the_binding_with_the_kubeconfigs_token_and_names_a_refusal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import orjson

    from joulesched.extender.kube import Binder
    from joulesched.extender.wire import BindingArgs

    refusal = orjson.dumps({"kind": "Status", "status": "Failure", "message": 'pods "p" is forbidden', "code": 403})
    server = Scripted([OK, b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n" % len(refusal) + refusal])
    binder = Binder(str(token_kubeconfig(tmp_path, server.port, "s3cret")))
    try:
        binder(BindingArgs("p", "ns", "uid-1", "node-a"))
        with pytest.raises(ExtenderError, match=r'^HTTP 403: pods "p" is forbidden$'):
            binder(BindingArgs("q", "ns", "", "node-b"))
        head, _, body = server.requests[0].partition(b"\r\n\r\n")
        assert head.startswith(b"POST /api/v1/namespaces/ns/pods/p/binding HTTP/1.1\r\n") and b"\r\nAuthorization: Bearer s3cret" in head
        assert orjson.loads(body) == {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
                                      "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}}
        assert server.connections == 1
    finally:
        assert binder._direct is not None
        binder._direct.close()
        server.close()


def test_the_binder_asks_the_client_for_its_token_once_a_while_and_makes_it_again_after_a_401(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The client's refresh hook sets its whole configuration on every call (40 µs a binding):
    # the binder sends the token it read for TOKEN_SECONDS. After a 401 it makes the client
    # again from the kubeconfig, and sends the refused binding once more with its token.
    import orjson

    from joulesched.extender.kube import Binder
    from joulesched.extender.wire import BindingArgs

    unauthorised = orjson.dumps({"kind": "Status", "status": "Failure", "message": "Unauthorized", "code": 401})
    server = Scripted([OK, OK, b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n" % len(unauthorised) + unauthorised, OK, OK, OK])
    binder = Binder(str(token_kubeconfig(tmp_path, server.port, "first")))
    client = binder._api()
    config = client.configuration
    asked: list[str] = []
    assert config.refresh_api_key_hook is not None  # the kubeconfig's token comes with the client's refresh hook

    def hook(c: Any) -> None:  # in its place: a token rotated each time it is asked for
        c.api_key["BearerToken"] = f"Bearer rotated-{len(asked)}"
        asked.append(c.api_key["BearerToken"])

    config.refresh_api_key_hook = hook
    binder.TOKEN_SECONDS = 3600.0  # no binding here outlives the token it was sent with
    try:
        binder(BindingArgs("a", "ns", "", "n"))
        binder(BindingArgs("b", "ns", "", "n"))
        binder(BindingArgs("c", "ns", "", "n"))  # refused, then bound by the client made again
        assert binder._api() is not client
        binder.TOKEN_SECONDS = 0.0  # from now on each token is past its time at the next binding
        binder(BindingArgs("d", "ns", "", "n"))
        binder(BindingArgs("e", "ns", "", "n"))
        sent = [re.search(rb"\r\nAuthorization: Bearer (\S+)\r\n", r).group(1).decode() for r in server.requests]  # type: ignore[union-attr]
        assert sent == ["rotated-0", "rotated-0", "rotated-0", "first", "first", "first"]
        assert asked == ["Bearer rotated-0"]
    finally:
        assert binder._direct is not None
        binder._direct.close()
        server.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
def test_new_connections_share_one_tls_context_until_its_ca_file_is_rotated(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.extender.test_tls import ca, sign

    def serving(chain: tuple[Any, Any]) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*chain)
        return ctx

    root, other = ca(tmp_path, "root"), ca(tmp_path, "other")
    ext = "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
    by_root, by_other = sign(tmp_path, "server", root, ext), sign(tmp_path, "server2", other, ext)
    cafile = tmp_path / "ca.crt"
    shutil.copy(root[0], cafile)
    closing = OK.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)  # every post on a new connection
    server = Scripted([closing] * 4, tls=serving(by_root))
    config = SimpleNamespace(host=f"https://127.0.0.1:{server.port}", tls_server_name=None, ssl_ca_cert=str(cafile),
                             verify_ssl=True, cert_file=None, key_file=None)
    conns = ApiConnections(config, 5.0)
    try:
        assert post(conns)[0] == 201
        assert conns._tls is not None
        made = conns._tls[1]
        assert post(conns)[0] == 201
        assert server.connections == 2 and conns._tls[1] is made  # the second connection's TLS: the same context
        server.tls = serving(by_other)  # the API server's certificate rotated to another CA
        with pytest.raises(ssl.SSLCertVerificationError):
            post(conns)  # the context made from the old CA file refuses it
        rotated = tmp_path / "ca.new"
        shutil.copy(other[0], rotated)
        os.replace(rotated, cafile)  # as a Secret's volume swaps its files
        assert post(conns)[0] == 201  # a context from the new file
        assert conns._tls[1] is not made
        assert server.connections == 4
    finally:
        conns.close()
        server.close()
