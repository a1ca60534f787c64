"""The agent's HTTP endpoints (standard library ``HTTPServer``, a bounded worker pool, TCP_NODELAY)::

    GET    /metrics             Prometheus text (OpenMetrics when asked), latest published snapshot
    GET    /healthz             liveness: 200 while sampling keeps up, 503 otherwise
    GET    /readyz              readiness: 200 while an energy source reads (or none is configured), 503 otherwise
    GET    /v1/profile          the node's profile document (policy.profile shape); 503 before a fit
    POST   /v1/windows          open a measurement window: reads every counter now → {"id", "start"}
    DELETE /v1/windows/{id}     close it: reads every counter now → energy per domain (J and kJ)
    POST   /v1/weblog           Nextflow's -with-weblog events: one window per run (measurement/weblog.py)
    GET    /v1/weblog/{runId}   that run's energy once it completed (or that it is still open)

Security (RAPL energy at fine resolution is a side channel: PLATYPUS, CVE-2020-8694):
``/metrics`` and ``/v1/profile`` only ever show per-interval values published at most once per
second. The windows API reads counters at arbitrary moments, so: with ``server.token_file`` set,
it needs ``Authorization: Bearer <token>`` (or ``Basic``, any user, the token as password: what
Nextflow's ``weblog.basicToken = "nextflow:<token>"`` sends); without a token it is served on a loopback address
only, and an unauthenticated window must span at least one second (closing it earlier answers
409 and leaves it open).

Robustness: connections wait in a selector until they send something, and only then take one
of ``workers`` threads, so idle connections cost no thread (they are closed after
``idle_seconds``, and beyond ``max_connections`` the longest idle one is closed); every socket read
times out after ``read_timeout`` seconds; the listen backlog is 128. ``POST /v1/windows`` and
``POST /v1/weblog`` check the token before they read a body, read at most 64 KiB (4 MiB for a weblog event; 413
beyond), and answer every malformed
request (Content-Length not a non-negative integer, chunked bodies, invalid UTF-8, JSON nested
too deep) with a JSON 400. Every error, whichever layer answers it (a request line the standard
library rejects, an unknown method, a handler that fails: 500), has a JSON body ``{"error": …}``.
Window edges read the meter with a bounded wait (``sources.read_wait_seconds``), never a source's
full timeout.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from joulesched.measurement.errors import TooManyWindows, UnknownWindow
from joulesched.measurement.exporters.profile import model_status, profile_document
from joulesched.measurement.sampler import Sampler
from joulesched.measurement.snapshot import Snapshot
from joulesched.measurement.weblog import WeblogRuns

log = logging.getLogger(__name__)

MIN_UNAUTHENTICATED_WINDOW = 1.0
MAX_BODY = 64 * 1024
# Nextflow sends the run's parameters and workflow with started and completed alike: an nf-core
# pipeline's are tens of KiB, and a completed refused for its size would leave the run open
MAX_WEBLOG_BODY = 4 * 1024 * 1024


WORKERS = 16
MAX_CONNECTIONS = 1024
IDLE_SECONDS = 30.0
READ_TIMEOUT = 10.0

_Address = Any  # (host, port) or (host, port, flowinfo, scope_id)


class AgentServer(HTTPServer):
    allow_reuse_address = True
    request_queue_size = 128  # the listen backlog (socketserver's default is 5)

    def __init__(
        self,
        address: tuple[str, int],
        *,
        sampler: Sampler,
        published: Callable[[], Snapshot | None],
        registry: CollectorRegistry,
        token: str | None,
        windows_allowed: bool,
        min_samples: int,
        stale_after: float,
        clock: Callable[[], float],
        workers: int = WORKERS,
        max_connections: int = MAX_CONNECTIONS,
        idle_seconds: float = IDLE_SECONDS,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self.sampler = sampler
        self.published = published
        self.registry = registry
        self.token = token
        self.windows_allowed = windows_allowed
        self.min_samples = min_samples
        self.stale_after = stale_after
        self.clock = clock
        self.max_connections = max_connections
        self.idle_seconds = idle_seconds
        self.read_timeout = read_timeout
        self.weblog = WeblogRuns(sampler, clock, MIN_UNAUTHENTICATED_WINDOW)
        super().__init__(address, _Handler)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agent-http-worker")
        self._selector = selectors.DefaultSelector()
        self._parked: queue.SimpleQueue[tuple[socket.socket, _Address]] = queue.SimpleQueue()
        self._idle: dict[socket.socket, tuple[float, _Address]] = {}  # waiting: deadline, peer
        self._busy = 0  # connections being served by a worker
        self._count_lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)  # a full wake-up pipe already wakes the poller
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._closing = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="agent-http-poll", daemon=True)
        self._poller.start()

    def readiness(self) -> tuple[bool, str]:
        """Ready while at least one energy source reads; a node configured without sources (CPU
        time only, by choice) is ready. Not ready says which sources fail and why."""
        meter = self.sampler.meter
        if not self.sampler.config.sources.order:
            return True, "ok (no energy source configured: CPU time only)"
        if meter.usable():
            return True, "ok"
        failing = [f"{s.name}: {s.error or 'not read yet'}" for s in meter.source_snapshots()]
        return False, "no usable energy source" + (" — " + "; ".join(failing) if failing else " (none opened)")

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="agent-http", daemon=True)
        thread.start()
        return thread

    # -- connections: parked in a selector until readable, then served by a pool worker ---------

    def process_request(self, request: Any, client_address: _Address) -> None:
        self._park(request, client_address)

    def _park(self, sock: socket.socket, address: _Address) -> None:
        self._parked.put((sock, address))
        try:
            self._wake_w.send(b"\0")
        except OSError:  # closing
            pass

    def _poll(self) -> None:
        while not self._closing.is_set():
            while True:
                try:
                    sock, address = self._parked.get_nowait()
                except queue.Empty:
                    break
                try:
                    self._selector.register(sock, selectors.EVENT_READ)
                except (ValueError, OSError):  # closed meanwhile
                    self.shutdown_request(sock)
                    continue
                with self._count_lock:
                    oldest = None
                    if self._idle and len(self._idle) + self._busy >= self.max_connections:
                        oldest = next(iter(self._idle))  # the longest idle makes room
                        del self._idle[oldest]
                    self._idle[sock] = (time.monotonic() + self.idle_seconds, address)
                if oldest is not None:
                    self._selector.unregister(oldest)
                    self.shutdown_request(oldest)
            for key, _ in self._selector.select(timeout=1.0):
                if key.fileobj is self._wake_r:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except OSError:
                        pass
                    continue
                conn: socket.socket = key.fileobj  # type: ignore[assignment]
                self._selector.unregister(conn)
                with self._count_lock:
                    _, address = self._idle.pop(conn)
                    self._busy += 1
                try:
                    self._pool.submit(self._serve, conn, address)
                except RuntimeError:  # the pool is shut down
                    with self._count_lock:
                        self._busy -= 1
                    self.shutdown_request(conn)
            now = time.monotonic()
            with self._count_lock:
                expired = [c for c, (deadline, _) in self._idle.items() if deadline <= now]
                for conn in expired:
                    del self._idle[conn]
            for conn in expired:
                self._selector.unregister(conn)
                self.shutdown_request(conn)

    def _serve(self, conn: socket.socket, address: _Address) -> None:
        keep = False
        try:
            conn.settimeout(self.read_timeout)
            handler = _Handler(conn, address, self)
            keep = handler.keep_alive
        except Exception:
            log.exception("request from %s failed", address)
        finally:
            with self._count_lock:
                self._busy -= 1
        if keep and not self._closing.is_set():
            self._park(conn, address)
        else:
            self.shutdown_request(conn)

    def server_close(self) -> None:
        self._closing.set()
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass
        self._poller.join(timeout=5.0)
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._count_lock:
            idle = list(self._idle)
            self._idle.clear()
        for conn in idle:
            self.shutdown_request(conn)
        while True:
            try:
                conn, _ = self._parked.get_nowait()
            except queue.Empty:
                break
            self.shutdown_request(conn)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()


class _Handler(BaseHTTPRequestHandler):
    server: AgentServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # StreamRequestHandler sets TCP_NODELAY on each connection
    server_version = "joulesched-agent"
    keep_alive = False  # set by handle(): the connection stays open for a next request
    _sent = False  # a status line went out for this request (a failure after it cannot answer 500)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)

    # -- helpers -------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(doc, indent=None).encode() + b"\n", "application/json", headers)

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's errors (a bad request line, headers too long, an unknown
        method) as JSON, like every other error of this server."""
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = ""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # an unparsable request line: answer with headers all the same
            self.request_version = "HTTP/1.1"
        body = json.dumps({"error": message or phrase or f"HTTP {code}"}).encode() + b"\n"
        self.send_response(code, message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD" and code >= 200 and code not in (HTTPStatus.NO_CONTENT, HTTPStatus.NOT_MODIFIED):
            self.wfile.write(body)

    def _guarded(self, verb: Callable[[], None]) -> None:
        """Run a verb; a failure inside it answers a JSON 500 (when nothing was sent yet)."""
        self._sent = False
        try:
            verb()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception as err:
            log.exception("%s %s failed", self.command, self.path[:200])
            self.close_connection = True
            if not self._sent:
                self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {type(err).__name__}"})

    def send_response(self, code: int, message: str | None = None) -> None:
        self._sent = True
        super().send_response(code, message)

    def _authorised(self) -> bool | None:
        """True with a valid token, False without one where that is allowed; None: answered."""
        if not self.server.windows_allowed:
            self.close_connection = True  # a body, if any, is never read
            self._json(
                HTTPStatus.FORBIDDEN,
                {
                    "error": "the windows API is disabled: the agent listens on a non-loopback address without "
                    "server.token_file; set a token file, or listen on 127.0.0.1"
                },
                {"Connection": "close"},
            )
            return None
        token = self.server.token
        header = self.headers.get("Authorization", "")
        if token is None:
            return False
        if header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip().encode(), token.encode()):
            return True
        if header.startswith("Basic "):
            try:
                password = base64.b64decode(header[6:].strip(), validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                password = b""
            if hmac.compare_digest(password, token.encode()):
                return True
        self.close_connection = True  # a body, if any, is never read
        self._json(
            HTTPStatus.UNAUTHORIZED,
            {"error": "missing or wrong bearer token"},
            {"WWW-Authenticate": "Bearer", "Connection": "close"},
        )
        return None

    def handle(self) -> None:
        """Serve the requests already sent on this connection; then give it back to the server to
        wait (without a thread) for the next one, unless it is to be closed."""
        self.keep_alive = False
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection:
            if not self._more_buffered():
                self.keep_alive = True
                return
            self.handle_one_request()

    def _more_buffered(self) -> bool:
        """Whether a further request is already here (pipelined): read without waiting."""
        conn = self.connection
        try:
            conn.setblocking(False)
            return bool(self.rfile.peek(1))  # type: ignore[attr-defined]
        except OSError:
            return False
        finally:
            try:
                conn.settimeout(self.server.read_timeout)
            except OSError:
                pass

    def _unknown_window(self, window_id: str) -> None:
        state_dir = self.server.sampler.config.server.state_dir
        why = (
            f"open windows are kept across restarts in {state_dir}"
            if state_dir
            else "windows opened before an agent restart are lost without server.state_dir"
        )
        self._error(HTTPStatus.NOT_FOUND, f"no open window {window_id[:80]!r}: never opened or already closed ({why})")

    def _refuse_body(self, status: int, message: str) -> None:
        """Answer without reading the body; the connection closes (the body is never read)."""
        self.close_connection = True
        self._json(status, {"error": message}, {"Connection": "close"})

    def _body(self, limit: int = MAX_BODY) -> dict[str, Any] | None:
        if self.headers.get("Transfer-Encoding"):
            self._refuse_body(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length, not chunked")
            return None
        header = self.headers.get("Content-Length")
        text = (header or "0").strip()
        if not text.isdigit() or not text.isascii():
            self._refuse_body(HTTPStatus.BAD_REQUEST, f"Content-Length must be a non-negative integer, got {header!r}")
            return None
        length = int(text)
        if length > limit:
            self._refuse_body(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body above {limit} bytes")
            return None
        try:
            raw = self.rfile.read(length) if length else b""
        except TimeoutError:
            self._refuse_body(HTTPStatus.REQUEST_TIMEOUT, f"body not received within {self.server.read_timeout:g} s")
            return None
        if len(raw) < length:
            self._refuse_body(HTTPStatus.BAD_REQUEST, f"body ended after {len(raw)} of {length} bytes")
            return None
        if not raw.strip():
            return {}
        try:
            doc = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            self._error(HTTPStatus.BAD_REQUEST, f"body is not UTF-8: {err}")
            return None
        except json.JSONDecodeError as err:
            self._error(HTTPStatus.BAD_REQUEST, f"body is not JSON: {err}")
            return None
        except RecursionError:
            self._error(HTTPStatus.BAD_REQUEST, "body is JSON nested too deep")
            return None
        if not isinstance(doc, dict):
            self._error(HTTPStatus.BAD_REQUEST, 'body must be a JSON object, e.g. {"label": "run-42"}')
            return None
        return doc

    # -- verbs ---------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._guarded(self._get)

    def do_POST(self) -> None:
        self._guarded(self._post)

    def do_DELETE(self) -> None:
        self._guarded(self._delete)

    def _get(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(HTTPStatus.OK, encoder(self.server.registry), content_type)
        elif path == "/healthz":
            latest = self.server.sampler.latest
            if latest is None:
                self._error(HTTPStatus.SERVICE_UNAVAILABLE, "no sample yet")
                return
            age = self.server.clock() - latest.time
            if age > self.server.stale_after:
                self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"last sample {age:.1f} s ago")
                return
            self._send(HTTPStatus.OK, b"ok\n", "text/plain")
        elif path == "/readyz":
            ready, detail = self.server.readiness()
            if ready:
                self._send(HTTPStatus.OK, detail.encode() + b"\n", "text/plain")
            else:
                self._error(HTTPStatus.SERVICE_UNAVAILABLE, detail)
        elif path.startswith("/v1/weblog/") and path[len("/v1/weblog/") :]:
            if self._authorised() is None:
                return
            code, found = self.server.weblog.result(path[len("/v1/weblog/") :])
            self._json(code, found)
        elif path == "/v1/profile":
            snap = self.server.published()
            doc = profile_document(snap) if snap is not None else None
            if doc is None:
                self._error(HTTPStatus.SERVICE_UNAVAILABLE, model_status(snap, self.server.min_samples))
                return
            self._json(HTTPStatus.OK, doc)
        else:
            self._error(
                HTTPStatus.NOT_FOUND, f"no such endpoint {path!r} (try /metrics, /healthz, /readyz, /v1/profile)"
            )

    def do_HEAD(self) -> None:
        self.do_GET()

    def _post(self) -> None:
        path = self.path.split("?", 1)[0]
        if path.rstrip("/") == "/v1/weblog":
            self._weblog()
            return
        if path.rstrip("/") != "/v1/windows":
            self._error(HTTPStatus.NOT_FOUND, f"no such endpoint {path!r}")
            return
        if self._authorised() is None:  # before the body: an unauthorised one is never read
            return
        body = self._body()
        if body is None:
            return
        label = body.get("label", "")
        if not isinstance(label, str) or len(label) > 200:
            self._error(HTTPStatus.BAD_REQUEST, "label must be a string of at most 200 characters")
            return
        self.server.weblog.expire()  # Nextflow runs whose head job died must not hold the open-window limit
        try:
            window = self.server.sampler.open_window(label)
        except TooManyWindows as err:
            self._error(HTTPStatus.TOO_MANY_REQUESTS, str(err))
            return
        self._json(
            HTTPStatus.CREATED,
            {"id": window.id, "label": label, "start": window.start.time + self.server.sampler.step()},
            {"Location": f"/v1/windows/{window.id}"},
        )

    def _weblog(self) -> None:
        authorised = self._authorised()  # before the body: an unauthorised one is never read
        if authorised is None:
            return
        body = self._body(MAX_WEBLOG_BODY)
        if body is None:
            return
        status, doc = self.server.weblog.handle(body, authorised)
        if status == HTTPStatus.OK and "run" in doc:
            run = doc["run"]
            log.info(
                "nextflow run %r (%r) %s: %.3f kJ",
                run["runName"][:80],
                run["runId"][:80],
                run["outcome"],
                doc["kilojoules"].get("node", 0.0),
            )
        self._json(status, doc)

    def _delete(self) -> None:
        path = self.path.split("?", 1)[0]
        prefix = "/v1/windows/"
        if not path.startswith(prefix) or not path[len(prefix) :]:
            self._error(HTTPStatus.NOT_FOUND, f"no such endpoint {path!r} (DELETE /v1/windows/{{id}})")
            return
        window_id = path[len(prefix) :]
        authorised = self._authorised()
        if authorised is None:
            return
        sampler = self.server.sampler
        try:
            window = sampler.window(window_id)
        except UnknownWindow:
            self._unknown_window(window_id)
            return
        age = self.server.clock() - window.start.time
        if not authorised and age < MIN_UNAUTHENTICATED_WINDOW:
            self._error(
                HTTPStatus.CONFLICT,
                f"window is {age:.2f} s old; without a bearer token a window must span at least "
                f"{MIN_UNAUTHENTICATED_WINDOW:g} s (it stays open: close it later, or configure server.token_file)",
            )
            return
        try:
            result = sampler.close_window(window_id)
        except UnknownWindow:
            self._unknown_window(window_id)
            return
        result["kilojoules"] = {k: v / 1000.0 for k, v in result["joules"].items()}
        self._json(HTTPStatus.OK, result)


__all__ = ["MIN_UNAUTHENTICATED_WINDOW", "AgentServer"]
