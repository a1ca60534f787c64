"""The extender's use of the Kubernetes API: binding pods, and watching bindings.

Both use the official ``kubernetes`` client. The client is imported here only, so that an
extender that neither binds nor watches never loads it.
"""

from __future__ import annotations

import logging
import math
import os
import select
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlsplit

import orjson

from joulesched.extender.errors import ExtenderError
from joulesched.extender.predicted import Occupancy, PredictedLoad, Unbound
from joulesched.extender.wire import BindingArgs
from joulesched.policy.demand import RUNTIME_ANNOTATION, demand_from_pod
from joulesched.policy.errors import PolicyError

log = logging.getLogger(__name__)


def preload() -> None:
    """Import the kubernetes client now, in the caller's thread.

    The import takes a second or more of CPU. Done lazily in a watch thread, it would hold the
    GIL while the worker's first scheduling requests wait, and under load push them past
    kube-scheduler's httpTimeout; done at app load, the worker only accepts once it is over.
    """
    from kubernetes import client, config

    # The client loads its API and model modules at first use (kubernetes/client/__init__.py):
    # the API class the watches and the binder use is loaded now too.
    _ = client.CoreV1Api, client.ApiClient, config.new_client_from_config


def api_client(kubeconfig: str) -> Any:
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()


class _BinderApi:
    """The binder's API client, its own connections where they cover it, and the files its
    credentials were read from with their stamps (``_file_stamp``) when it was made."""

    __slots__ = ("client", "direct", "files", "stamps")

    def __init__(self, client: Any, direct: ApiConnections | None, files: tuple[str, ...], stamps: tuple[object, ...]) -> None:
        self.client = client
        self.direct = direct
        self.files = files
        self.stamps = stamps

    def changed(self) -> bool:
        """A file it was made from has changed since (or is gone, or has come)."""
        return tuple(_file_stamp(f) for f in self.files) != self.stamps


class Binder:
    """Creates ``pods/binding`` for the bind verb (RBAC: create on pods/binding).

    One POST of a prepared JSON body with the kubernetes client's credentials (its TLS
    settings, client certificate or bearer token, refreshed as the client refreshes it), not
    through the generated API method, which built and checked a request model per call (3.35
    ms of CPU a binding against the real kube-apiserver). Sent over :class:`ApiConnections`
    where they set the connection up as the client would (``ApiConnections.covers``: not
    through a proxy, no ``assert_hostname``, socket options or TCP keep-alive), else through
    the client's own pool manager.

    The API client is made at the first bind, not at start: like the watches, an extender
    started where the API is not reachable yet serves filter and prioritize; a bind it cannot
    make goes back to kube-scheduler as an error, and kube-scheduler (``ignorable``) binds the
    pod itself.

    The client is made again from the kubeconfig (or the in-cluster config), as each watch's
    listing makes its own: after a 401 (the binding is then sent once more, if the new client
    has other credentials: a POST refused as unauthenticated was not applied), after a TLS
    failure (at the next binding; never sent again, a reply may have been lost), and when a
    file its credentials came from has changed — the kubeconfig, its user's ``tokenFile``, the
    client certificate, its key, the CA file: looked at when the token is asked again, every
    ``TOKEN_SECONDS``, not at each binding. The kubernetes client reads a kubeconfig's
    ``tokenFile`` once, when it is made: a token rotated on disk reaches the API only through a
    new client.
    """

    # kube-scheduler gives up on the bind verb after its httpTimeout (deploy/: 1 s) and, being
    # ignorable, binds the pod itself to the same node: one of the two writes then gets 409.
    TIMEOUT_SECONDS = 5.0
    # How long a bearer token read from the client is sent before it is asked again, and how
    # long the files the client was made from go unlooked at. The client's refresh hook sets
    # its whole configuration again on every call (the in-cluster loader's and the
    # kubeconfig's alike), and setting the host reads the proxy settings of the process's
    # environment, every variable of it (a pod's holds a set for each Service of its
    # namespace): 40 µs of CPU a binding in a bare environment, 70–90 in the bench's. A
    # ServiceAccount token the kubelet rotates stays valid until it expires (at least 10
    # minutes after it was issued; the kubelet replaces it at 80 % of its lifetime), so sending
    # it a few seconds longer is safe. A 401 makes the client again at once.
    TOKEN_SECONDS = 5.0

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self._current: _BinderApi | None = None
        self._lock = threading.Lock()
        # (the client it is for, asked again after (monotonic), the Authorization header):
        # one tuple, read and replaced whole, so a binding never pairs a client with another's token
        self._token: tuple[_BinderApi, float, str | None] | None = None

    @property
    def _direct(self) -> ApiConnections | None:
        """The connections of the client in use (None before the first binding, or when they do
        not cover its configuration)."""
        current = self._current
        return current.direct if current is not None else None

    def _api(self) -> Any:
        """The API client in use, made now if there is none (its token is asked at the next binding)."""
        with self._lock:
            if self._current is None:
                self._current = self._make()
            return self._current.client

    def _credentials(self) -> tuple[_BinderApi, str | None]:
        """The client for the next binding and its Authorization header (None without a token:
        a client certificate, or no credentials), asked of the client at most every
        TOKEN_SECONDS."""
        token = self._token
        if token is not None and time.monotonic() < token[1]:
            return token[0], token[2]
        return self._renew(None)

    def _renew(self, failed: _BinderApi | None) -> tuple[_BinderApi, str | None]:
        """Ask the client for its token again; make the client again first when it is
        ``failed`` (a 401 or a TLS failure with it), when there is none yet, or when a file it
        was made from has changed. A client that cannot be made raises (``failed`` or none:
        the binding fails, naming the kubeconfig) or, when only its files changed (a
        kubeconfig written half-way), is kept and made again at the next look."""
        with self._lock:
            now = time.monotonic()
            token, current = self._token, self._current
            if failed is None and token is not None and token[0] is current and now < token[1]:
                return token[0], token[2]  # another binding's thread asked meanwhile
            why = ""
            if current is None:
                why = "first binding"
            elif current is failed:
                why = "the API refused its credentials"
            elif current.changed():
                why = "a file it was made from has changed"
            if why:
                try:
                    made = self._make()
                except Exception as err:
                    where = self.kubeconfig or "the in-cluster config"
                    if current is None or current is failed:
                        self._current = self._token = None
                        raise ExtenderError(f"binder: cannot make the API client from {where}: {type(err).__name__}: {err}") from err
                    log.warning("binder: keeping the API client in use: cannot make it again from %s (%s): %s", where, why, err)
                else:
                    if current is not None:
                        log.info("binder: API client made again from %s: %s", self.kubeconfig or "the in-cluster config", why)
                    current = self._current = made
            assert current is not None
            header = current.client.configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
            self._token = (current, now + self.TOKEN_SECONDS, header)
            return current, header

    def _make(self) -> _BinderApi:
        # The kubeconfig's files are stamped before the client reads them: a file written in
        # between makes the client again at the next look, never goes unseen.
        files = _kubeconfig_files(self.kubeconfig) if self.kubeconfig else []
        stamps = [_file_stamp(f) for f in files]
        client = api_client(self.kubeconfig)
        config = client.configuration
        for f in (config.ssl_ca_cert, config.cert_file, config.key_file):
            if f and f not in files:
                files.append(f)
                stamps.append(_file_stamp(f))
        direct = ApiConnections(config, self.TIMEOUT_SECONDS) if ApiConnections.covers(config) else None
        return _BinderApi(client, direct, tuple(files), tuple(stamps))

    def __call__(self, args: BindingArgs) -> None:
        metadata: dict[str, str] = {"name": args.pod_name, "namespace": args.pod_namespace}
        if args.pod_uid:  # the API then refuses to bind a recreated pod of the same name
            metadata["uid"] = args.pod_uid
        body = orjson.dumps(
            {"apiVersion": "v1", "kind": "Binding", "metadata": metadata, "target": {"apiVersion": "v1", "kind": "Node", "name": args.node}}
        )
        path = f"/api/v1/namespaces/{quote(args.pod_namespace, safe='')}/pods/{quote(args.pod_name, safe='')}/binding"
        api, token = self._credentials()
        status, data = self._post(api, token, path, body)
        if status == 401:
            # Not authenticated, so not applied: the credentials may have been rotated since the
            # client was made (a kubeconfig's tokenFile, a revoked token, a client certificate).
            # The client is made again, and the binding sent once more if its credentials differ.
            renewed, renewed_token = self._renew(api)
            if (renewed_token, renewed.files, renewed.stamps) != (token, api.files, api.stamps):
                api, token = renewed, renewed_token
                status, data = self._post(api, token, path, body)
        if not 200 <= status < 300:
            raise ExtenderError(f"HTTP {status}: {_status_message(data)}")

    def _post(self, api: _BinderApi, token: str | None, path: str, body: bytes) -> tuple[int, bytes]:
        """(status, body) of one POST; nothing is retried here: a bind that fails goes back to
        kube-scheduler, which binds the pod itself."""
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "joulesched-extender"}
        if token:
            headers["Authorization"] = token
        try:
            if api.direct is not None:
                return api.direct.post(path, headers, body)
            config = api.client.configuration
            resp = api.client.rest_client.pool_manager.request(
                "POST", config.host.rstrip("/") + path, body=body, headers=headers, timeout=self.TIMEOUT_SECONDS, retries=False
            )
            return resp.status, resp.data
        except Exception as err:
            if _tls_failure(err):  # a rotated CA or client certificate: the next binding makes the client again
                self._drop(api)
            raise

    def _drop(self, api: _BinderApi) -> None:
        """The next binding makes the client again, unless another one has already."""
        with self._lock:
            if self._current is api:
                self._current = self._token = None
                log.info("binder: TLS failure with the API server: the next binding makes the API client again")


def _tls_failure(err: BaseException) -> bool:
    """``err`` is a TLS failure: ssl's own, or urllib3's (through the client's pool manager)."""
    from urllib3.exceptions import SSLError

    return isinstance(err, ssl.SSLError | SSLError)


def _kubeconfig_files(kubeconfig: str) -> list[str]:
    """The files a client made from ``kubeconfig`` reads its credentials from, found as the
    kubernetes client finds them: each file of the kubeconfig (a list joined with ``:``, as in
    ``KUBECONFIG``), and the current context's user's ``tokenFile`` (relative to the file that
    names it; unless the user has a ``token``, which the client takes first). The client
    certificate, its key and the CA come from the client's configuration. A kubeconfig that
    cannot be read gives its own files only: making the client then says what is wrong."""
    from kubernetes.config.kube_config import ENV_KUBECONFIG_PATH_SEPARATOR, KubeConfigMerger

    files = [os.path.expanduser(p) for p in kubeconfig.split(ENV_KUBECONFIG_PATH_SEPARATOR) if p]
    try:
        merged = KubeConfigMerger(kubeconfig).config
        context = merged["contexts"].get_with_name(merged["current-context"])["context"]
        user = merged["users"].get_with_name(context["user"])["user"]
        token_file = user.safe_get("tokenFile")
        if isinstance(token_file, str) and token_file and not user.safe_get("token"):
            base = os.path.abspath(os.path.dirname(user.path)) if user.path else ""
            files.append(os.path.normpath(os.path.join(base, token_file)))
    except Exception:  # anything the parse meets: the client's own loading names it
        pass
    return files


class ApiConnections:
    """HTTP/1.1 POSTs of small bodies to the API server, on kept-alive connections of its own.

    What a binding costs the extender was mostly its HTTP client's: urllib3 and http.client
    build the request header by header and parse the reply's headers through the email
    package, 0.98–1.14 ms of CPU a binding against the real kube-apiserver; this writes the
    request in one piece and reads the status line, the body's length (Content-Length or
    chunked) and ``Connection``: 0.27–0.40 ms (docs/benchmarks.md, "The binding's API write").
    TLS as the kubernetes client sets it up (``kubernetes/client/rest.py``): the CA (file or
    data, else the system's), ``verify_ssl``, the client certificate, ``tls_server_name``.

    Each request takes an idle connection, or opens one; a connection goes back idle only
    after a whole reply that did not ask to close, and is dropped when found readable while
    idle (the server closed it). Nothing is retried: a POST may have been applied. New
    connections share one TLS context, made again once a file it was made from has changed:
    a context costs about as much CPU as the handshake (0.9 against 1.1 ms against the real
    kube-apiserver), and a burst opens one connection for each binding in flight.
    """

    MAX_HEAD_BYTES = 64 * 1024
    MAX_BODY_BYTES = 1024 * 1024  # a Binding's reply, or the API's Status: a few hundred bytes

    def __init__(self, config: Any, timeout: float) -> None:
        url = urlsplit(config.host)
        self.tls = url.scheme == "https"
        self.address = (url.hostname or "", url.port or (443 if self.tls else 80))
        self.authority = url.netloc
        self.prefix = url.path.rstrip("/")
        self.timeout = timeout
        self.server_hostname = config.tls_server_name or url.hostname
        self.config = config
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self.close = weakref.finalize(self, _close_all, self._idle)  # idle connections, when dropped
        self._tls: tuple[tuple[object, ...], ssl.SSLContext] | None = None  # (the files' stamps, their context)
        self._tls_lock = threading.Lock()  # the threads of a burst's first bindings wait for one context

    def _context(self) -> ssl.SSLContext:
        """TLS for a new connection: the context made last, unless a file it was made from
        has changed since (rotated certificates), or is gone (then making one names it)."""
        config = self.config
        stamps = tuple(_file_stamp(f) for f in (config.ssl_ca_cert, config.cert_file, config.key_file))
        with self._tls_lock:
            if self._tls is None or self._tls[0] != stamps:
                self._tls = (stamps, self._new_context())
            return self._tls[1]

    def _new_context(self) -> ssl.SSLContext:
        config = self.config
        ctx = ssl.create_default_context(cafile=config.ssl_ca_cert, cadata=getattr(config, "ca_cert_data", None))
        ctx.hostname_checks_common_name = False  # as urllib3: subjectAltName only
        if not config.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if config.cert_file:
            ctx.load_cert_chain(config.cert_file, config.key_file)
        return ctx

    @staticmethod
    def covers(config: Any) -> bool:
        """The client's configuration is one these connections set up exactly as it would."""
        from kubernetes.client.rest import should_bypass_proxies

        proxy = getattr(config, "proxy", None)
        return (
            (not proxy or should_bypass_proxies(config.host, getattr(config, "no_proxy", None) or ""))
            and getattr(config, "assert_hostname", None) is None
            and getattr(config, "socket_options", None) is None
            and not getattr(config, "keep_alive", False)
            and urlsplit(config.host).scheme in ("http", "https")
        )

    def post(self, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, bytes]:
        """(status, body) of the reply; OSError or ExtenderError when there is none."""
        lines = [f"POST {self.prefix}{path} HTTP/1.1", f"Host: {self.authority}"]
        for name, value in headers.items():
            if "\r" in value or "\n" in value:
                raise ExtenderError(f"the {name} header for the API server holds a line break")
            lines.append(f"{name}: {value}")
        lines.append(f"Content-Length: {len(body)}")
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        sock = self._take()
        try:
            deadline = time.monotonic() + self.timeout
            sock.settimeout(self.timeout)
            sock.sendall(request)
            status, data, keep = self._reply(sock, deadline)
        except BaseException:
            sock.close()
            raise
        if keep:
            with self._lock:
                self._idle.append(sock)
        else:
            sock.close()
        return status, data

    def _take(self) -> socket.socket:
        with self._lock:
            while self._idle:
                sock = self._idle.pop()
                try:
                    poll = select.poll()
                    poll.register(sock, select.POLLIN)
                    if not poll.poll(0):
                        return sock
                except (OSError, ValueError):
                    pass
                sock.close()  # readable while idle: closed by the server (or talking out of turn)
        raw = socket.create_connection(self.address, self.timeout)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not self.tls:
                return raw
            return self._context().wrap_socket(raw, server_hostname=self.server_hostname)
        except BaseException:
            raw.close()
            raise

    def _reply(self, sock: socket.socket, deadline: float) -> tuple[int, bytes, bool]:
        """Read one reply, whole by ``deadline`` (monotonic): (status, body, whether the
        connection may carry another)."""
        rest = bytearray()
        while True:  # an interim (1xx) reply is followed by the reply
            buf = rest
            while (end := buf.find(b"\r\n\r\n")) < 0:
                if len(buf) > self.MAX_HEAD_BYTES:
                    raise ExtenderError(f"the API server's reply head is over {self.MAX_HEAD_BYTES} bytes")
                buf += self._recv(sock, deadline)
            head = bytes(buf[:end]).split(b"\r\n")
            rest = buf[end + 4 :]
            version, _, status_rest = head[0].partition(b" ")
            code = status_rest.partition(b" ")[0]
            if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
                raise ExtenderError(f"not an HTTP/1.x reply from the API server: {head[0][:80]!r}")
            if not code.startswith(b"1") or code == b"101":
                break
        length: int | None = None
        chunked = False
        close = version == b"HTTP/1.0"
        for line in head[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                if not value.isdigit():
                    raise ExtenderError(f"the API server's reply has Content-Length {value[:40]!r}")
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = value.endswith(b"chunked")
            elif name == b"connection":
                close = b"close" in value or (version == b"HTTP/1.0" and b"keep-alive" not in value)
        if code in (b"204", b"304"):  # no body, whatever the headers say
            data, extra = b"", bool(rest)
        elif chunked:
            data, extra = self._chunked(sock, rest, deadline)
        elif length is not None:
            if length > self.MAX_BODY_BYTES:
                raise ExtenderError(f"the API server's reply body of {length} bytes is over {self.MAX_BODY_BYTES}")
            while len(rest) < length:
                rest += self._recv(sock, deadline)
            data, extra = bytes(rest[:length]), len(rest) > length
        else:  # the body runs to the end of the connection
            while chunk := self._recv(sock, deadline, eof_ok=True):
                rest += chunk
                if len(rest) > self.MAX_BODY_BYTES:
                    raise ExtenderError(f"the API server's reply body is over {self.MAX_BODY_BYTES} bytes")
            data, extra, close = bytes(rest), False, True
        return int(code), data, not close and not extra

    def _chunked(self, sock: socket.socket, buf: bytearray, deadline: float) -> tuple[bytes, bool]:
        body = bytearray()
        while True:
            while (eol := buf.find(b"\r\n")) < 0:
                if len(buf) > self.MAX_HEAD_BYTES:
                    raise ExtenderError("the API server's reply has a chunk size line that does not end")
                buf += self._recv(sock, deadline)
            size_field = bytes(buf[:eol]).split(b";")[0].strip()
            try:
                size = int(size_field, 16)
            except ValueError:
                raise ExtenderError(f"the API server's reply has a chunk size {size_field[:40]!r}") from None
            del buf[: eol + 2]
            if size == 0:
                while (end := buf.find(b"\r\n")) != 0 and (end := buf.find(b"\r\n\r\n")) < 0:
                    if len(buf) > self.MAX_HEAD_BYTES:
                        raise ExtenderError(f"the API server's reply trailers are over {self.MAX_HEAD_BYTES} bytes")
                    buf += self._recv(sock, deadline)  # trailers, if any, end with an empty line
                del buf[: end + (2 if end == 0 else 4)]
                return bytes(body), bool(buf)
            if len(body) + size > self.MAX_BODY_BYTES:
                raise ExtenderError(f"the API server's reply body is over {self.MAX_BODY_BYTES} bytes")
            while len(buf) < size + 2:
                buf += self._recv(sock, deadline)
            if buf[size : size + 2] != b"\r\n":
                raise ExtenderError("the API server's reply has a chunk not ended by CRLF")
            body += buf[:size]
            del buf[: size + 2]

    @staticmethod
    def _recv(sock: socket.socket, deadline: float, eof_ok: bool = False) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the API server's reply did not arrive whole within the timeout")
        sock.settimeout(left)  # the timeout bounds the whole reply, not each read of it
        chunk = sock.recv(65536)
        if not chunk and not eof_ok:
            raise ExtenderError("the API server closed the connection before the end of its reply")
        return chunk


def _file_stamp(path: str | None) -> tuple[int, int, int] | str | None:
    """What says a file has changed: its inode, size and modification time (a rotation
    replaces or rewrites the file); the error's text when it cannot be read, None for no file."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _close_all(sockets: list[socket.socket]) -> None:
    while sockets:
        sockets.pop().close()


def _status_message(data: bytes) -> str:
    """The ``message`` of the API's Status reply, else the start of the body."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        doc = None
    message = doc.get("message") if isinstance(doc, dict) else None
    if isinstance(message, str):
        return message
    return data[:200].decode("utf-8", "replace")


# A watch's read timeout: kube-apiserver ends each watch after its ``timeoutSeconds`` (300 s
# here), so a connection silent for this much longer is dead, not idle, and is opened again.
WATCH_SECONDS = 300
WATCH_READ_GRACE_SECONDS = 30
# Once a watch has read every event that has arrived, it waits this long before it reads on,
# so that the events of a burst (one a binding, 3–5 ms apart) are read a batch at a time: a
# watch thread woken for each event cost 210–460 µs of CPU an event under a burst, against
# 60–85 µs to read one (docs/benchmarks.md, "The pod watch's CPU"). The first event after a
# quiet spell is read at once; the others of a burst up to this much later.
WATCH_BATCH_SECONDS = 0.05
BLOCKED_READ_SECONDS = 0.001  # a read that took longer waited for the network, not a buffer
# The longest watch line read: one event holds one object, which etcd keeps to 1.5 MiB (its
# default request limit) and kube-apiserver writes as JSON in a few times that at most. A longer
# line (a proxy or server that sends no newline) is refused, not buffered without end.
MAX_WATCH_LINE_BYTES = 32 * 1024 * 1024


class WatchExpired(ExtenderError):
    """The watch's resourceVersion is too old (410 Gone): list again, now."""


def watch_events(
    list_call: Callable[..., Any],
    batch_seconds: float = WATCH_BATCH_SECONDS,
    timeout_seconds: int = WATCH_SECONDS,
    **params: Any,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The events of one watch request, as ``(type, object)``, the object as the API's JSON.

    ``list_call`` is a generated list method (``CoreV1Api.list_node``…); its watch response is
    read here rather than through ``kubernetes.watch``, whose ``stream`` yields ``None`` for a
    line it cannot decode (the caller then failed on ``None.get`` and listed again, saying
    nothing of the line) and whose callers here set no read timeout (a connection that died
    without a FIN held the watch forever). A line that is not a JSON event raises
    ``ExtenderError`` naming it, and the caller lists again with back-off; so does an ``ERROR``
    event, with the API's message, except 410 Gone (the resourceVersion expired), which raises
    ``WatchExpired``: list again at once. The reader costs no more than the library's: 63–66 µs of CPU
    an event against 72–85 µs (docs/benchmarks.md, "The pod watch's CPU").
    When every event that has arrived is read, the next read waits ``batch_seconds`` (see
    ``WATCH_BATCH_SECONDS``; 0 reads on at once). The response is closed when the caller stops
    iterating.
    """
    resp = list_call(
        watch=True,
        timeout_seconds=timeout_seconds,
        _preload_content=False,
        _request_timeout=(30, timeout_seconds + WATCH_READ_GRACE_SECONDS),
        **params,
    )
    try:
        for line in _lines(resp, batch_seconds):
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError as err:
                raise ExtenderError(f"watch: a line that is not JSON ({err}): {bytes(line[:120])!r}") from None
            if not isinstance(event, dict) or not isinstance(event.get("type"), str) or not isinstance(event.get("object"), dict):
                raise ExtenderError(f"watch: not an event (type and object): {bytes(line[:120])!r}")
            kind, obj = event["type"], event["object"]
            if kind == "ERROR":
                said = f"watch: the API answered {obj.get('code', '')} {obj.get('reason', '')}: {obj.get('message', obj)}"
                raise (WatchExpired if obj.get("code") == 410 else ExtenderError)(said)
            yield kind, obj
    finally:
        resp.close()
        resp.release_conn()


def _lines(resp: Any, batch_seconds: float = 0.0) -> Iterator[bytes]:
    """The response's newline-ended lines (kube-apiserver writes one event a line, a chunk each).

    A response that is not chunked (through some proxy) is read with ``read1``, which returns
    what has arrived: ``stream(n)`` would wait for n bytes, holding events back. After a read
    that waited for its bytes, once what came is read and the connection has nothing more, the
    next read waits ``batch_seconds``: once a batch, so an event waits one batch at most — but
    for one that http.client had buffered already, read by a thread held back over 1 ms (the
    GIL, the CPU) and so taken for a read that waited: such a read waits a batch too, at most
    as many times as events fit in http.client's buffer (8 KiB; one TLS record, usually one
    event, from kube-apiserver).
    """
    pending = bytearray()  # the start of a line cut by a chunk's end
    chunks = resp.read_chunked(decode_content=True) if resp.chunked else iter(lambda: resp.read1(65536, decode_content=True), b"")
    sock = getattr(getattr(resp, "connection", None), "sock", None) if batch_seconds > 0 else None
    waited = True  # a read since the last wait waited for the network: the next wait starts a batch
    while True:
        arrived = sock is not None and not waited and _readable(sock)  # (once waited, no need to look)
        before = time.monotonic()
        chunk = next(chunks, None)
        if chunk is None:
            break
        # (A read of what had arrived may be slow too, waiting for the GIL: not a wait for the network.)
        waited = waited or (not arrived and time.monotonic() - before > BLOCKED_READ_SECONDS)
        start = 0
        if pending:  # the line goes on: only the new chunk is searched, and the line grows in place
            end = chunk.find(b"\n")
            pending += chunk if end < 0 else chunk[:end]
            if end >= 0:
                yield bytes(pending)
                pending.clear()
                start = end + 1
        if not pending:
            while (end := chunk.find(b"\n", start)) >= 0:
                if end > start:
                    yield chunk[start:end]
                start = end + 1
            pending += chunk[start:]
        if len(pending) > MAX_WATCH_LINE_BYTES:
            raise ExtenderError(
                f"watch: a line over {MAX_WATCH_LINE_BYTES} bytes without its newline: {bytes(pending[:120])!r}"
            )
        # Once a batch: after a read that waited, when the events that came are all read (none
        # cut in two, nothing more on the connection). Chunks http.client had already buffered
        # come at once, and wait for nothing.
        if sock is not None and waited and not pending and not _readable(sock):
            time.sleep(batch_seconds)
            waited = False
    if pending.strip():
        yield bytes(pending)


def _readable(sock: Any) -> bool:
    """Bytes have arrived on the connection, or TLS holds some decrypted (True too when that
    cannot be told: the next read then says what is wrong, without waiting first).

    What http.client has buffered already is not seen here; those chunks are read without a
    wait (see ``_lines``).
    """
    try:
        pending = getattr(sock, "pending", None)
        if pending is not None and pending():
            return True
        poll = select.poll()
        poll.register(sock, select.POLLIN)
        return bool(poll.poll(0))
    except (OSError, ValueError):
        return True  # closed under us: the next read says so, without waiting first


class ListWatch:
    """A daemon thread that lists and watches, again and again; never raises.

    One run (``_watch_once``) is a watch, after a listing where it needs one: a watch the API
    server ended cleanly (its ``timeoutSeconds``) is followed by another from the last
    resourceVersion it saw (an event's, or a BOOKMARK's: the watches ask for them, so that
    resourceVersion stays recent while no event matches the selector), without listing again,
    as client-go's reflector does; a run that failed in any way lists first. A subclass says
    how to list (``_list``: take the listing as the truth, return its resourceVersion), how to
    watch from a resourceVersion (``_watch``) and what an event does (``_handle``).

    A run that held for ``HELD_SECONDS`` was working: whatever ended it (the API server's watch
    timeout, a 410 for a resourceVersion too old, a connection cut), the next starts at once
    and the back-off starts again from its first step. A run that ended sooner, cleanly or not, waits the
    back-off first, doubling up to ``MAX_BACKOFF_SECONDS``: a watch the API server (or a proxy)
    ends at once is not listed again in a loop, and a watch cut every few minutes is not left
    further behind each time. A 410 (``WatchExpired``) is the exception: the listing's
    resourceVersion expired before its watch caught up (etcd compacted it), and a listing now
    gives a current one, so the next lists at once however soon it came, and the back-off is
    left where it was — unless a 410 was last listed again at once less than
    ``EXPIRED_REPEAT_SECONDS`` before: an API server that answers 410 to every watch is then
    listed again with the back-off, not in a loop. ``error`` names the last failure (not a
    410); a subclass that reports it clears it once a listing succeeds (the deferrer's
    PodCache).
    """

    name = "watch"
    HELD_SECONDS = 10.0
    FIRST_BACKOFF_SECONDS = 1.0
    MAX_BACKOFF_SECONDS = 60.0
    EXPIRED_REPEAT_SECONDS = 60.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.listed = threading.Event()  # the first listing is in: what follows comes by the watch
        self.error = ""
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.monotonic: Callable[[], float] = time.monotonic
        self.watch_seconds = WATCH_SECONDS  # the watch's timeoutSeconds: the API server ends it then
        self.lists = 0  # listings made: the first, and one after every run that failed
        self._resume: str | None = None  # the resourceVersion the next run watches from; None: list first

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        backoff = self.FIRST_BACKOFF_SECONDS
        expired_at = -math.inf  # when a 410 was last listed again at once
        while not self._stop.is_set():
            started = self.monotonic()
            failure: Exception | None = None
            try:
                self._watch_once()
            except Exception as err:
                failure = err
            ended = self.monotonic()
            expired = isinstance(failure, WatchExpired)
            if ended - started >= self.HELD_SECONDS:
                backoff, wait = self.FIRST_BACKOFF_SECONDS, 0.0
                if expired:
                    expired_at = ended
            elif expired and ended - expired_at >= self.EXPIRED_REPEAT_SECONDS:
                wait, expired_at = 0.0, ended  # "list again, now"; the back-off stays where it was
            else:
                wait, backoff = backoff, min(backoff * 2, self.MAX_BACKOFF_SECONDS)
            if expired:
                log.info("%s: %s; listing again in %.0f s", self.name, failure, wait)
            elif failure is not None:
                self.error = f"{type(failure).__name__}: {failure}"[:300]
                log.warning("%s failed, retrying in %.0f s: %s", self.name, wait, failure)
            if wait:
                self._stop.wait(wait)

    def _watch_once(self) -> None:
        version, self._resume = self._resume, None  # a run that fails lists again
        if version is None:
            version = self._list()
            self.lists += 1
            self.listed.set()
        for kind, obj in self._watch(version):
            if self._stop.is_set():
                return
            if kind != "BOOKMARK":  # a BOOKMARK carries a resourceVersion and nothing else
                self._handle(kind, obj)
            version = (obj.get("metadata") or {}).get("resourceVersion") or version
        self._resume = version

    def _list(self) -> str:
        """List, take the listing as the truth, and return its resourceVersion."""
        raise NotImplementedError

    def _watch(self, version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """The events of one watch from ``version``: ``watch_events`` with the listing's
        selectors, ``timeout_seconds=self.watch_seconds`` and ``allow_watch_bookmarks=True``."""
        raise NotImplementedError

    def _handle(self, kind: str, obj: dict[str, Any]) -> None:
        raise NotImplementedError


def listing_version(listing: dict[str, Any]) -> str:
    version = (listing.get("metadata") or {}).get("resourceVersion")
    if not isinstance(version, str) or not version:
        raise ExtenderError(f"list: no metadata.resourceVersion in the API's listing: {str(listing.get('metadata'))[:120]}")
    return version


class NodeServerWatch(ListWatch):
    """Keeps ``extender.node_servers`` (node name -> physical server id) from node labels.

    RBAC: list and watch nodes. The map is replaced whole on each change, never mutated, so
    readers need no lock.
    """

    name = "node-server-watch"

    def __init__(self, kubeconfig: str, label: str, extender: Any) -> None:
        super().__init__()
        self.kubeconfig = kubeconfig
        self.label = label
        self.extender = extender
        self._api: Any = None  # the client of the last listing, which the watches after it use

    def _list(self) -> str:
        from kubernetes import client

        self._api = client.CoreV1Api(api_client(self.kubeconfig))
        resp: Any = self._api.list_node(label_selector=self.label, _request_timeout=30, _preload_content=False)
        listing = orjson.loads(resp.data)
        servers = {}
        for node in listing.get("items") or []:
            meta = node.get("metadata") or {}
            server = (meta.get("labels") or {}).get(self.label)
            if meta.get("name") and server:
                servers[meta["name"]] = server
        self.extender.node_servers = servers
        return listing_version(listing)

    def _watch(self, version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        # With the label selector a node whose label is removed comes as DELETED.
        return watch_events(
            self._api.list_node,
            label_selector=self.label,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_seconds,
        )

    def _handle(self, kind: str, node: dict[str, Any]) -> None:
        meta = node.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return
        server = (meta.get("labels") or {}).get(self.label)
        current = dict(self.extender.node_servers)
        if kind == "DELETED" or not server:
            current.pop(name, None)
        else:
            current[name] = server
        self.extender.node_servers = current


BOUND_PODS = "spec.nodeName!="  # a field selector: pods assigned to a node


class PodBindingWatch(ListWatch):
    """Watches pods cluster-wide and records every new binding as predicted load.

    The pods already bound when it lists them are recorded at the time they were bound, those
    of the last ``ttl_seconds``: an extender that starts while pods are being placed (a replica
    of a rolling update, a restart mid-burst) counts the placements of the seconds before it as
    load no measurement shows yet; older ones are taken as measured, as the ledger's own
    placements are once they settle. Deleted pods are forgotten, those deleted while the watch
    was broken off when it lists again. Failures are logged and retried with back-off; they
    never reach a request.
    """

    name = "pod-binding-watch"

    def __init__(
        self,
        kubeconfig: str,
        predicted: PredictedLoad,
        clock: Callable[[], float] = time.time,
        occupancy: Occupancy | None = None,
        unbound: Unbound | None = None,
    ) -> None:
        super().__init__()
        self.kubeconfig = kubeconfig
        self.predicted = predicted
        self.clock = clock
        self.occupancy = occupancy
        self.unbound = unbound
        self._bound: set[str] = set()
        self._api: Any = None  # the client of the last listing, which the watches after it use

    def _list(self) -> str:
        from kubernetes import client

        self._api = client.CoreV1Api(api_client(self.kubeconfig))
        # Raw JSON throughout: building a V1Pod per event and turning it back into a dict cost
        # milliseconds of CPU per pod, enough for the watch to fall a burst behind the
        # scheduler, and every placement it has not seen yet is load the policy cannot see.
        resp: Any = self._api.list_pod_for_all_namespaces(
            field_selector=BOUND_PODS, _request_timeout=30, _preload_content=False
        )
        listing = orjson.loads(resp.data)
        version = listing_version(listing)
        items = listing.get("items") or []
        bound = {uid for p in items if (uid := (p.get("metadata") or {}).get("uid"))}
        # A listing after the watch broke off: the pods it had seen bound and the listing no
        # longer has were deleted in the gap, and their load leaves the ledger as a DELETED
        # would have taken it; those bound in the gap end any decision's wait for them.
        gone, new = self._bound - bound, bound - self._bound
        self._bound = bound
        for uid in gone:
            self.predicted.forget(uid)
        self.record_listed(items)
        if self.unbound is not None:
            for uid in new:  # after the record, as in handle
                self.unbound.bound(uid, by_bind_verb=False)
        if self.occupancy is not None:
            held = {}
            for pod in items:
                until = holds_node_until(pod)
                if until is not None:
                    held[pod["metadata"]["uid"]] = (pod["spec"]["nodeName"], until)
            self.occupancy.replace(held)
        return version

    def _watch(self, version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        # The watch has the listing's selector: the API server drops pending pods' events (their
        # creation, kube-scheduler's status patch on every failed attempt), and a pod appears
        # as ADDED once bound.
        return watch_events(
            self._api.list_pod_for_all_namespaces,
            field_selector=BOUND_PODS,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_seconds,
        )

    def _handle(self, kind: str, pod: dict[str, Any]) -> None:
        self.handle(kind, pod)

    def record_listed(self, items: list[dict[str, Any]]) -> None:
        """Record the listed pods bound within ``ttl_seconds``, each at the time it was bound.

        A placement's time is what the ledger expires it by (``ttl_seconds`` after it, or once
        a measurement ``settle_seconds`` younger exists), so a listing seen again (the watch
        lists again after an error) moves nothing: the same placement keeps its first time.
        Pods that have terminated hold no CPU and are left out.
        """
        now = self.clock()
        for pod in items:
            meta = pod.get("metadata") or {}
            node = (pod.get("spec") or {}).get("nodeName")
            if terminated(pod):  # finished in the gap: its load leaves the ledger, as in handle
                self.predicted.forget(meta.get("uid") or "")
                continue
            at = bound_at(pod)
            if not node or at is None or now - at > self.predicted.ttl:
                continue
            self._record_bound(meta.get("uid") or "", node, pod, min(at, now))

    def _record_bound(self, uid: str, node: str, pod: dict[str, Any], at: float) -> None:
        """Record pod ``uid`` bound to ``node``, seen by the watch or its listing.

        A placement on that node recorded here already (the bind verb, or the top choice) keeps
        its demand: the decision's, the owner's observed CPU where known, which the requests
        would overwrite. One with no cores (a bind whose pod was decided on the other replica,
        its demand unknown here; a pod's never is zero: demand_from_pod) takes the requests,
        as does a pod the ledger does not have there.
        """
        placed = self.predicted.placement(uid)
        if placed is not None and placed.node == node and placed.cores > 0:
            self.predicted.record(uid, node, placed.cores, placed.gpus, at, confirmed=True)
            return
        try:
            demand = demand_from_pod(pod)
        except PolicyError as err:
            meta = pod.get("metadata") or {}
            log.info("pod %s/%s: %s", meta.get("namespace"), meta.get("name"), err)
            return
        self.predicted.record(uid, node, demand.cpu_cores, float(demand.gpus), at, confirmed=True)

    def handle(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid") or ""
        node = (pod.get("spec") or {}).get("nodeName")
        if kind == "DELETED":
            self._bound.discard(uid)
            self.predicted.forget(uid)
            if self.occupancy is not None:
                self.occupancy.forget(uid)
            return
        if self.occupancy is not None and node:
            until = holds_node_until(pod)
            if until is None:
                self.occupancy.forget(uid)
            else:
                self.occupancy.set(uid, node, until)
        finished = terminated(pod)
        if finished:  # holds no CPU any more, however recently it was placed
            self.predicted.forget(uid)
        if not node or uid in self._bound:
            return
        self._bound.add(uid)
        if not finished:
            self._record_bound(uid, node, pod, self.clock())
        if self.unbound is not None:
            # After the record: a decision waiting on this pod must find it in the ledger.
            self.unbound.bound(uid, by_bind_verb=False)  # bound by another replica or binder


def terminated(pod: dict[str, Any]) -> bool:
    """Whether the pod has finished (Succeeded or Failed): it holds no CPU, bound or not."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def bound_at(pod: dict[str, Any]) -> float | None:
    """When a bound pod was bound (unix time): its PodScheduled condition's last transition to
    True, which the API server sets with the binding; else (a pod created with its node, before
    its kubelet reports the condition) its creation. None when neither is readable.

    Both are the API server's clock, to the second, where the watch records a binding it sees
    at the extender's own time: a listed placement may leave the ledger that much early.
    """
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if isinstance(condition, dict) and condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            at = _timestamp(condition.get("lastTransitionTime"))
            if at is not None:
                return at
    return _timestamp((pod.get("metadata") or {}).get("creationTimestamp"))


def holds_node_until(pod: dict[str, Any]) -> float | None:
    """Until when a bound pod keeps its node powered (unix time; inf: no known end), or None.

    None for a pod that holds no node: a DaemonSet's (it runs on every node), or one that has
    terminated. A pod that declares its runtime holds the node until its start plus that
    runtime; any other pod for good.
    """
    meta = pod.get("metadata") or {}
    if any((ref or {}).get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or ()):
        return None
    if terminated(pod):
        return None
    raw = (meta.get("annotations") or {}).get(RUNTIME_ANNOTATION)
    try:
        runtime = float(raw) if raw is not None else math.inf
    except (TypeError, ValueError):
        runtime = math.inf
    if not math.isfinite(runtime) or runtime < 0:
        return math.inf
    started = _timestamp((pod.get("status") or {}).get("startTime")) or _timestamp(meta.get("creationTimestamp"))
    return math.inf if started is None else started + runtime


def _timestamp(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None
