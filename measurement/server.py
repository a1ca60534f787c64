"""The agent's HTTP endpoints (standard library ``ThreadingHTTPServer``, TCP_NODELAY)::

    GET    /metrics             Prometheus text (OpenMetrics when asked), latest published snapshot
    GET    /healthz             200 while sampling keeps up, 503 otherwise
    GET    /v1/profile          the node's profile document (policy.profile shape); 503 before a fit
    POST   /v1/windows          open a measurement window: reads every counter now → {"id", "start"}
    DELETE /v1/windows/{id}     close it: reads every counter now → energy per domain (J and kJ)

Security (RAPL energy at fine resolution is a side channel: PLATYPUS, CVE-2020-8694):
``/metrics`` and ``/v1/profile`` only ever show per-interval values published at most once per
second. The windows API reads counters at arbitrary moments, so: with ``server.token_file`` set,
it needs ``Authorization: Bearer <token>``; without a token it is served on a loopback address
only, and an unauthenticated window must span at least one second (closing it earlier answers
409 and leaves it open).
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from joulesched.measurement.errors import TooManyWindows, UnknownWindow
from joulesched.measurement.exporters.profile import model_status, profile_document
from joulesched.measurement.sampler import Sampler
from joulesched.measurement.snapshot import Snapshot

log = logging.getLogger(__name__)

MIN_UNAUTHENTICATED_WINDOW = 1.0
MAX_BODY = 64 * 1024


class AgentServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

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
    ) -> None:
        self.sampler = sampler
        self.published = published
        self.registry = registry
        self.token = token
        self.windows_allowed = windows_allowed
        self.min_samples = min_samples
        self.stale_after = stale_after
        self.clock = clock
        super().__init__(address, _Handler)

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="agent-http", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: AgentServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # StreamRequestHandler sets TCP_NODELAY on each connection
    server_version = "joulesched-agent"

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

    def _authorised(self) -> bool | None:
        """True with a valid token, False without one where that is allowed; None: answered."""
        if not self.server.windows_allowed:
            self._error(
                HTTPStatus.FORBIDDEN,
                "the windows API is disabled: the agent listens on a non-loopback address without "
                "server.token_file; set a token file, or listen on 127.0.0.1",
            )
            return None
        token = self.server.token
        header = self.headers.get("Authorization", "")
        if token is None:
            return False
        if header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip().encode(), token.encode()):
            return True
        self._json(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong bearer token"}, {"WWW-Authenticate": "Bearer"})
        return None

    def _body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body above {MAX_BODY} bytes")
            return None
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return {}
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError as err:
            self._error(HTTPStatus.BAD_REQUEST, f"body is not JSON: {err}")
            return None
        if not isinstance(doc, dict):
            self._error(HTTPStatus.BAD_REQUEST, 'body must be a JSON object, e.g. {"label": "run-42"}')
            return None
        return doc

    # -- verbs ---------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(HTTPStatus.OK, encoder(self.server.registry), content_type)
        elif path == "/healthz":
            latest = self.server.sampler.latest
            if latest is None:
                self._send(HTTPStatus.SERVICE_UNAVAILABLE, b"no sample yet\n", "text/plain")
                return
            age = self.server.clock() - latest.time
            if age > self.server.stale_after:
                self._send(HTTPStatus.SERVICE_UNAVAILABLE, f"last sample {age:.1f} s ago\n".encode(), "text/plain")
                return
            self._send(HTTPStatus.OK, b"ok\n", "text/plain")
        elif path == "/v1/profile":
            snap = self.server.published()
            doc = profile_document(snap) if snap is not None else None
            if doc is None:
                self._error(HTTPStatus.SERVICE_UNAVAILABLE, model_status(snap, self.server.min_samples))
                return
            self._json(HTTPStatus.OK, doc)
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no such endpoint {path!r} (try /metrics, /healthz, /v1/profile)")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path.rstrip("/") != "/v1/windows":
            self._error(HTTPStatus.NOT_FOUND, f"no such endpoint {path!r}")
            return
        body = self._body()
        if body is None:
            return
        if self._authorised() is None:
            return
        label = body.get("label", "")
        if not isinstance(label, str) or len(label) > 200:
            self._error(HTTPStatus.BAD_REQUEST, "label must be a string of at most 200 characters")
            return
        try:
            window = self.server.sampler.open_window(label)
        except TooManyWindows as err:
            self._error(HTTPStatus.TOO_MANY_REQUESTS, str(err))
            return
        self._json(
            HTTPStatus.CREATED,
            {"id": window.id, "label": label, "start": window.start.time},
            {"Location": f"/v1/windows/{window.id}"},
        )

    def do_DELETE(self) -> None:
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
            self._error(HTTPStatus.NOT_FOUND, f"no open window {window_id!r}")
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
            self._error(HTTPStatus.NOT_FOUND, f"no open window {window_id!r}")
            return
        result["kilojoules"] = {k: v / 1000.0 for k, v in result["joules"].items()}
        self._json(HTTPStatus.OK, result)


__all__ = ["MIN_UNAUTHENTICATED_WINDOW", "AgentServer"]
