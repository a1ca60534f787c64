"""The extender's gunicorn worker: ``gthread``, but a pool thread only ever sees a whole request.

gunicorn's ``gthread`` worker hands a connection to a pool thread as soon as it has a byte to
read (or after 5 s with none), and that thread then blocks until the client has sent the whole
request. Idle sockets renewed every few seconds, a client sending one header line a second, a
``Content-Length`` larger than what follows, or a chunk size of ``ffffffffffffffffff`` each hold
one of the few threads, and kube-scheduler's calls queue behind them past their 1 s timeout
(docs/benchmarks.md, "Starvation").

:class:`FrontBufferedWorker` reads every request in the worker's event loop instead, without
blocking: the head, then ``Content-Length`` bytes of body, all within
``server.request_timeout_seconds`` of the connection's first byte (or of its acceptance).
Only then does a pool thread get it, with the body already in memory, so a thread waits on the
CPU and on no client, but for the ``NEXT_REQUEST_SECONDS`` (50 ms) after a reply in which a
client's next request, if it comes whole, is answered by the same thread, and never more than
half of a pool's threads (at least one) wait so at once. Slow, idle and lying clients cost a
file descriptor each until their deadline, not a thread. The rules, each
answered with a JSON error and counted in ``joulesched_extender_failures_total{verb="http"}``:

* a request not read in full by its deadline: 408, connection closed;
* a head over 64 KiB: 431; ``Transfer-Encoding`` (chunked bodies; kube-scheduler always sends
  ``Content-Length``): 411;
* a ``Content-Length`` over ``max_request_bytes``: handed on unread, so the app answers 413, and
  the connection is closed (``Connection: close``) instead of its body being drained;
* bodies being read or served hold at most two ``max_request_bytes`` per worker: a connection
  that would exceed that gets 503 and is closed, so memory is bounded whatever the number of
  clients (docs/benchmarks.md, "Memory"). Outside that budget, a thread waiting for its
  connection's next request (below) holds at most two reads of it (``RECV_BYTES`` each), and
  at most half of a pool's threads wait so.

A complete ``POST {prefix}/<verb>`` over HTTP/1.1 — every request kube-scheduler sends — is
then served by the pool thread straight from the head and body already read: the extender's
verb endpoint and a reply written in one ``sendall``, without gunicorn's request parser, WSGI
environ and response object (they took more CPU than the 100-node policy evaluation itself:
docs/benchmarks.md, "Scheduling throughput"). Everything else (health, readiness, metrics,
other methods and paths, HTTP/1.0, a malformed head) goes through gunicorn and Flask. With the
bind verb writing the bindings, its requests have a pool of their own (``bind.threads``): a bind
holds its thread until the API server has answered, and filter and prioritize never wait behind
them. A bind that writes nothing (``bind.write: false``) holds no thread longer than a decision
does, and is served by the same threads (see :func:`bind_pool`).

Replies are written by the pool thread with a socket timeout of the same deadline, so a client
that does not read its reply holds a thread that long at most. Closing a connection lingers on
it (to drain what the client still sends, RFC 9112 section 9.6) in the event loop, not in a
blocking call. TLS (``server.tls``: gunicorn's ``certfile``, ``keyfile``, ``ca_certs``) is
handshaken in the event loop too; with ``server.tls.client_ca_file`` a request other than a GET
of /healthz, /readyz or /metrics without a verified client certificate gets 403 (the
handshake asks for one but lets the kubelet's probes in without).
"""

from __future__ import annotations

import errno
import re
import select
import selectors
import socket
import ssl
import threading
import time
from concurrent import futures
from functools import partial
from typing import Any, NamedTuple

import orjson
from gunicorn import http, sock, util
from gunicorn.workers.gthread import TConn, ThreadWorker

from joulesched.extender.config import ExtenderConfig
from joulesched.extender.wire import REASONS

MAX_HEAD_BYTES = 64 * 1024
# How long a stopping worker keeps a kept-alive connection open for a request already on its way
# (gunicorn's gthread keeps its own that long: gunicorn.workers.gthread.STOP_KEEPALIVE_LINGER).
STOP_KEEPALIVE_LINGER = 2.0
LINGER_SECONDS = 2.0
# How long the thread that answered a request waits for the next one on its connection. In a
# burst kube-scheduler's next request often comes more than 2 ms later (a prioritize after its
# filter, a filter after a bind; docs/benchmarks.md, "Waiting longer for the next request").
NEXT_REQUEST_SECONDS = 0.05
RECV_BYTES = 262144  # one read from a socket
HANDED_ON = object()  # _serve_verb's answer when the connection's next request went to the other pool
_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    411: "Length Required",
    414: "URI Too Long",
    417: "Expectation Failed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}

class HeadLimits(NamedTuple):
    """gunicorn's limits on a request head (``limit_request_line``, ``_fields``, ``_field_size``; 0: none)."""

    line: int = 4094
    fields: int = 100
    field_size: int = 8190


GUNICORN_DEFAULTS = HeadLimits()
# The header lines gunicorn's parser takes (gunicorn.http.message: TOKEN_RE for the name; no NUL,
# CR or LF in the value), then the empty line: one pass over the head, in C.
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"  # one character of an RFC 9110 token (a method, a header's name)
_HEADER_LINES = re.compile(rb"(?:" + _TOKEN + rb"+:[^\x00\r\n]*\r\n)*\r\n")


# gunicorn's parser errors that are not 400, as gunicorn answers them (Worker.handle_error).
_PARSE_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (http.errors.LimitRequestLine, 414),
    (http.errors.LimitRequestHeaders, 431),
    (http.errors.ExpectationFailed, 417),
    (http.errors.UnsupportedTransferCoding, 501),
    (http.errors.ForbiddenProxyRequest, 403),
)


class FrontBody:
    """``wsgi.input`` over a body read before the request reached its thread.

    A whole read returns the buffer itself (a ``bytearray``, which orjson and the app take as
    they take ``bytes``): a body is in memory once, not once per layer.
    """

    failed = False

    def __init__(self, data: bytes | bytearray) -> None:
        self._data = data
        self._pos = 0

    def read(self, size: int | None = None) -> bytes | bytearray:
        data, pos = self._data, self._pos
        if size is None or size < 0 or size >= len(data) - pos:
            self._pos = 0
            self._data = b""
            return data if pos == 0 else data[pos:]
        self._pos = pos + size
        return data[pos : pos + size]

    def readline(self, size: int | None = None) -> bytes | bytearray:
        data, pos = self._data, self._pos
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end + 1
        if size is not None and 0 <= size < end - pos:
            end = pos + size
        self._pos = end
        return data[pos:end]

    def readlines(self, hint: int | None = None) -> list[bytes | bytearray]:
        lines = []
        while line := self.readline():
            lines.append(line)
        return lines

    def __iter__(self) -> Any:
        return iter(self.readlines())


class FrontConn(TConn):  # type: ignore[misc]
    """A connection and the request being read into it."""

    def __init__(self, cfg: Any, sock: socket.socket, client: Any, server: Any) -> None:
        super().__init__(cfg, sock, client, server)
        self.buf = bytearray()
        self.deadline = 0.0
        self.head: bytes | None = None  # the request head, once complete
        self.need = 0  # bytes of the buffer the whole request takes (head + body)
        self.body: bytes | bytearray | None = None
        self.oversize = False
        self.sent_continue = False
        self.held = 0  # this connection's share of FrontBufferedWorker.inflight
        self.handshaken = not isinstance(sock, ssl.SSLSocket)
        self.verified = False  # a client certificate signed by the configured CA was presented
        self.verb: str | None = None  # a request for the direct verb path (see the module doc)
        self.close_after = False  # its head asked for Connection: close
        self.polled = False  # registered with the event loop while its request is read
        self.ended = False  # the client closed it while a thread waited for its next request


class FrontBufferedWorker(ThreadWorker):  # type: ignore[misc]
    alive: bool  # gunicorn's, untyped there
    nr: int
    max_requests: int
    head_limits: HeadLimits = GUNICORN_DEFAULTS  # the configured ones from run()

    def init_process(self) -> None:
        self.reading: set[FrontConn] = set()
        self.lingering: dict[FrontConn, float] = {}
        self.buffered = 0  # bytes of requests being read
        self.inflight = 0  # bytes of bodies handed to threads and not yet answered
        self._ssl_context: ssl.SSLContext | None = None
        self.bind_pool: futures.ThreadPoolExecutor | None = None  # made in run(), from the config
        self.stopped = False  # the event loop has ended
        super().init_process()

    def run(self) -> None:
        extension = getattr(self.wsgi, "extensions", {}).get("joulesched", {})
        config = extension.get("config") or ExtenderConfig()
        self.max_body = config.max_request_bytes
        self.request_timeout = config.server.request_timeout_seconds
        self.require_client_cert = bool(config.server.tls_client_ca_file) and self.cfg.is_ssl
        self.budget = 2 * self.max_body
        self.endpoint = extension.get("endpoint")
        self.verb_prefix = (config.prefix.rstrip("/") + "/").encode()
        self.head_limits = HeadLimits(
            self.cfg.limit_request_line, self.cfg.limit_request_fields, self.cfg.limit_request_field_size
        )
        # Answering a client's next request in the thread that answered the last: plain TCP
        # only (a TLS socket can hold decrypted bytes that poll does not see).
        self.follow_up = self.endpoint is not None and not self.cfg.is_ssl
        self._notified = 0.0
        self.bind_pool = bind_pool(config)
        # At most half of a pool's threads (at least one) wait for their connection's next
        # request at a time: the rest are free for the requests the event loop reads.
        self.waiting_slots = {self.tpool: threading.BoundedSemaphore(max(1, self.cfg.threads // 2))}
        if self.bind_pool is not None:
            self.waiting_slots[self.bind_pool] = threading.BoundedSemaphore(max(1, config.bind_threads // 2))
        try:
            super().run()
        finally:
            self.stopped = True  # a bind still waiting on the API server hands nothing back
            if self.bind_pool is not None:  # binds still queued are kube-scheduler's to retry
                self.bind_pool.shutdown(wait=False, cancel_futures=True)

    def enqueue_req(self, conn: FrontConn) -> None:
        """A bind on the direct verb path goes to the bind verb's own threads, the rest to gunicorn's.

        A bind holds its thread until the API server has answered its binding, and
        kube-scheduler sends each pod's bind from a goroutine of its own, as soon as the pod is
        placed: with the API server busy, dozens are in flight at once (32 of 32 threads in a
        burst at 100 nodes, docs/benchmarks.md "Bindings in flight"). In one pool they took
        every thread, and the next pod's filter waited for one.
        """
        self._pool(conn.verb).submit(self.handle, conn).add_done_callback(partial(self._served, conn))

    def _served(self, conn: FrontConn, fs: futures.Future[Any]) -> None:
        """Once ``conn``'s request is served (in the thread that served it, or the one that added
        this callback): the event loop takes the connection back, unless the other pool has it
        now (see _serve_verb), whose thread then hands it back, or the event loop has ended."""
        if not fs.cancelled() and fs.exception() is None and fs.result() is HANDED_ON:
            return
        if self.stopped:  # a bind answered after the worker stopped: nothing takes the connection back
            conn.close()
            return
        self.method_queue.defer(self.finish_request, conn, fs)

    def notify(self) -> None:
        # gunicorn touches its heartbeat file on every pass of the event loop, a system call per
        # request; the arbiter only needs it within ``timeout`` (30 s).
        now = time.monotonic()
        if now - self._notified >= min(1.0, self.timeout / 4):
            self._notified = now
            super().notify()

    # -- accepting and reading, in the event loop ---------------------------------------------

    def accept(self, listener: socket.socket) -> None:
        try:
            client, addr = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        if self.endpoint is not None:
            self.endpoint.metrics.connections.inc()
        client.setblocking(False)
        if self.cfg.is_ssl:
            try:
                client = self._ssl().wrap_socket(
                    client,
                    server_side=True,
                    do_handshake_on_connect=False,
                    suppress_ragged_eofs=self.cfg.suppress_ragged_eofs,
                )
            except (OSError, ssl.SSLError):
                self.nr_conns -= 1
                util.close(client)
                return
        conn = FrontConn(self.cfg, client, addr, listener.getsockname())
        # The request usually came with the connection: read it now, not after a pass of the
        # event loop (kube-scheduler opens a connection for about every other pod it binds).
        self._start_reading(conn, bytearray(), readable=True)

    def _ssl(self) -> ssl.SSLContext:
        if self._ssl_context is None:  # gunicorn builds one per connection, re-reading the certificates
            self._ssl_context = sock.ssl_context(self.cfg)
        return self._ssl_context

    def _start_reading(self, conn: FrontConn, data: bytearray, readable: bool = False) -> None:
        conn.buf = data
        conn.head = None
        conn.body = None
        conn.need = 0
        conn.oversize = False
        conn.sent_continue = False
        conn.verb = None
        conn.close_after = False
        conn.deadline = time.monotonic() + self.request_timeout
        self.buffered += len(data)
        self.reading.add(conn)
        if readable:  # read what is there now, not after another pass of the event loop
            if self._read(conn):
                return
        elif data and self._parse(conn):
            return
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))
        conn.polled = True

    def on_client_socket_readable(self, conn: FrontConn, client: socket.socket) -> None:
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._start_reading(conn, bytearray(), readable=True)

    def _on_readable(self, conn: FrontConn, _sock: Any) -> None:
        self._read(conn)

    def _read(self, conn: FrontConn) -> bool:
        """Read what the socket holds; True when the connection left the reading set."""
        s = conn.sock
        try:
            if not conn.handshaken:
                s.do_handshake()
                conn.handshaken = True
                conn.verified = bool(s.getpeercert())
            while True:
                chunk = s.recv(RECV_BYTES)
                if not chunk:
                    self._drop(conn)
                    return True
                conn.buf += chunk
                self.buffered += len(chunk)
                if self.buffered + self.inflight > self.budget:
                    # Over the budget: the connection holding the most unread bytes goes, this
                    # one on a tie. Refusing whichever crossed the line let two clients that
                    # stall with large bodies refuse every small request (kube-scheduler's).
                    largest = max(self.reading, key=lambda c: (len(c.buf), c is conn))
                    self._reject(largest, 503, "busy", "the extender is reading too many large requests at once; retry")
                    if largest is conn:
                        return True
                if len(chunk) < RECV_BYTES and not isinstance(s, ssl.SSLSocket):
                    break
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
            pass
        except (OSError, ssl.SSLError):
            self._drop(conn)
            return True
        return self._parse(conn)

    def _parse(self, conn: FrontConn) -> bool:
        """Hand the request on once it is complete; True when it left the reading set."""
        buf = conn.buf
        if conn.head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    self._reject(conn, 431, "head_too_large", f"request head over {MAX_HEAD_BYTES} bytes")
                    return True
                # what cannot become a request is answered now, not at the read deadline
                wrong = _request_line_problem(buf, self.head_limits.line)
                if wrong:
                    self._reject(conn, *wrong)
                    return True
                return False
            if end + 4 > MAX_HEAD_BYTES:  # (a head that came whole in one read as well as in pieces)
                self._reject(conn, 431, "head_too_large", f"request head over {MAX_HEAD_BYTES} bytes")
                return True
            conn.head = bytes(buf[: end + 4])
            if self.require_client_cert and not conn.verified and not _open_to_all(conn.head):
                message = "a client certificate signed by server.tls.client_ca_file is required"
                self._reject(conn, 403, "no_client_certificate", message)
                return True
            length, problem = _body_length(conn.head, self.head_limits)
            if problem:
                status, reason, message = problem
                self._reject(conn, status, reason, message)
                return True
            if length is None:  # a malformed head: gunicorn's parser answers it
                conn.need = len(conn.head)
            elif length > self.max_body:
                conn.oversize = True
                conn.need = len(conn.head)
            else:
                conn.need = len(conn.head) + length
                if self.endpoint is not None:
                    conn.verb, conn.close_after = _direct_verb(conn.head, self.verb_prefix)
                if length and len(buf) < conn.need and b"100-continue" in conn.head.lower():
                    conn.sent_continue = True
                    try:
                        conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
                    except (OSError, ssl.SSLError):
                        pass
        if len(buf) < conn.need:
            return False
        self._hand_over(conn)
        return True

    def _hand_over(self, conn: FrontConn) -> None:
        self._stop_reading(conn)
        buf = conn.buf
        conn.buf = bytearray()
        head = conn.head or b""
        rest = b""
        if conn.oversize:
            rest = bytes(buf[len(head) :])
        elif len(buf) > conn.need:  # pipelined: the next request's bytes stay for later
            rest = bytes(buf[conn.need :])
            del buf[conn.need :]
        if not conn.oversize and conn.need > len(head):
            del buf[: len(head)]  # in place: the body is the buffer itself, never a second copy
            conn.body = buf
            conn.held = len(buf)
            self.inflight += conn.held
        if conn.verb is not None:
            conn.pipelined = rest
            conn.sock.setblocking(True)
            self.enqueue_req(conn)
            return
        if conn.parser is None:
            conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
            conn.initialized = True
        # The parser reads the head from here; a pipelined next request stays buffered behind it
        # (an oversize request's partial body goes back in front of the socket for gunicorn).
        conn.parser.unreader.unread(head + (rest if conn.oversize else b""))
        conn.pipelined = b"" if conn.oversize else rest
        conn.sock.setblocking(True)
        self.enqueue_req(conn)

    def _stop_reading(self, conn: FrontConn) -> None:
        if conn in self.reading:
            self.reading.discard(conn)
            self.buffered -= len(conn.buf)
        if conn.polled:  # (a request read at once never was: unregistering it formatted a KeyError)
            conn.polled = False
            try:
                self.poller.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass

    def _reject(self, conn: FrontConn, status: int, reason: str, message: str) -> None:
        self._stop_reading(conn)
        try:
            conn.sock.send(self._error_reply(status, reason, message))  # best effort: never wait on this client
        except (OSError, ssl.SSLError):
            pass
        self._linger(conn)

    def _error_reply(self, status: int, reason: str, message: str) -> bytes:
        """A counted JSON error reply (``verb="http"``) that closes the connection."""
        body = orjson.dumps({"Error": message})
        if self.endpoint is not None:
            _, body = self.endpoint.fail("http", status, reason, message)
        head = f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        return head.encode() + body

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        """A request gunicorn's parser refuses gets gunicorn's status, as JSON like every other
        answer (gunicorn writes an HTML page), counted as ``reason="malformed"``; anything else
        is a bug here, logged with its trace and answered 500."""
        response_header = (http.errors.InvalidResponseHeader, http.errors.InvalidResponseHeaderName)
        if isinstance(exc, http.errors.ConfigurationProblem):  # gunicorn's own settings: its 500
            self.log.warning("Invalid request from ip=%s: %s", (addr or ("",))[0], exc)
            reply = self._error_reply(500, "internal", str(exc))
        elif isinstance(exc, http.errors.ParseException) and not isinstance(exc, response_header):
            status = next((code for kind, code in _PARSE_STATUS if isinstance(exc, kind)), 400)
            self.log.warning("Invalid request from ip=%s: %s", (addr or ("",))[0], exc)
            reply = self._error_reply(status, "malformed", f"malformed request: {exc}")
        else:
            self.log.exception("Error handling request")
            reply = self._error_reply(500, "internal", "internal error in the extender's HTTP worker (logged)")
        try:
            util.write_nonblock(client, reply)
        except Exception:
            self.log.debug("Failed to send error message.")

    def _drop(self, conn: FrontConn) -> None:
        self._stop_reading(conn)
        self.nr_conns -= 1
        conn.close()

    def _linger(self, conn: FrontConn) -> None:
        """Half-close and drain without blocking, then close (at most LINGER_SECONDS)."""
        try:
            conn.sock.setblocking(False)
            conn.sock.shutdown(socket.SHUT_WR)
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_lingering, conn))
        except (OSError, ValueError, KeyError):
            self.nr_conns -= 1
            conn.close()
            return
        self.lingering[conn] = time.monotonic() + LINGER_SECONDS

    def _on_lingering(self, conn: FrontConn, _sock: Any) -> None:
        try:
            if conn.sock.recv(65536):
                return
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
            return
        except (OSError, ssl.SSLError):
            pass
        self._end_linger(conn)

    def _end_linger(self, conn: FrontConn) -> None:
        if self.lingering.pop(conn, None) is None:
            return
        try:
            self.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self) -> None:
        super().murder_pending()
        now = time.monotonic()
        for conn in [c for c in self.reading if c.deadline <= now]:
            if conn.buf:
                self._reject(
                    conn, 408, "read_timeout", f"request not received in full within {self.request_timeout:g} s"
                )
            else:
                self._drop(conn)
        for conn in [c for c, deadline in self.lingering.items() if deadline <= now]:
            self._end_linger(conn)

    # -- serving, in a pool thread ------------------------------------------------------------

    def handle(self, conn: FrontConn) -> Any:
        if conn.verb is not None:
            return self._serve_verb(conn)
        req = None
        try:
            conn.sock.settimeout(self.request_timeout)
            req = next(conn.parser)
            if not req:
                return False
            if conn.body is not None:
                req.body = FrontBody(conn.body)
                conn.body = None
            if conn.sent_continue or conn.oversize:  # (oversize: its body is not wanted, 413 alone)
                req._expected_100_continue = False
            if conn.oversize:
                req.must_close = True  # its body is not read: the reply says Connection: close
            return self.handle_request(req, conn) and not conn.oversize
        except http.errors.NoMoreData as e:
            self.log.debug("Ignored premature client disconnection. %s", e)
        except StopIteration as e:
            self.log.debug("Closing connection. %s", e)
        except (TimeoutError, ssl.SSLError) as e:
            self.log.debug("Closing connection: %s", e)
        except OSError as e:
            if e.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                self.log.exception("Socket error processing request.")
        except Exception as e:
            self.handle_error(req, conn.sock, conn.client, e)
        return False

    def _serve_verb(self, conn: FrontConn) -> bool | object:
        """The direct verb path: True to keep the connection for the next request.

        After a reply the thread waits up to ``NEXT_REQUEST_SECONDS`` for the client's next
        request, reading it in as many pieces as come in that time, and, when what it read is
        one whole verb request and nothing more, answers it too: in a burst kube-scheduler's
        requests on a connection come milliseconds apart, and each hop through the event loop
        and back costs two thread wake-ups. It waits only while fewer than half of its pool's
        threads (at least one) are waiting so: the others stay free for the requests the event
        loop reads. Anything else (nothing in time, part of a request when the time is up,
        more than one, a body over one read or waiting for 100 Continue, a malformed or
        oversize head, TLS) goes back to the event loop with the bytes read, under its
        deadlines: a thread still waits on no client longer than that. A connection the client
        closed meanwhile is marked ``ended``, and the event loop closes it without waiting on it
        again. A next request for the other pool (a bind after a decision, a decision after a
        bind: see enqueue_req) is handed to that pool from here.
        """
        verb, body = conn.verb or "", conn.body or b""
        conn.verb = None
        conn.body = None
        if _hung_up(conn.sock):  # closed while the request waited for this thread
            self.endpoint.abandon(verb, body)
            return False
        while True:
            keep = self._answer(conn, verb, body)
            if not keep or not self.follow_up or conn.pipelined:
                return keep  # (bytes already read after the request: the event loop's)
            slots = self.waiting_slots[self._pool(verb)]
            if not slots.acquire(blocking=False):
                return keep  # enough of the pool's threads wait already: the event loop's
            try:
                follow = self._next_request(conn)
            finally:
                slots.release()
            if follow is None:
                return keep and not conn.ended
            next_verb, body, conn.close_after = follow
            if self._pool(next_verb) is not self._pool(verb) and self.alive:  # (stopping: served here)
                held, conn.held = conn.held, 0
                conn.verb, conn.body = next_verb, body
                self.enqueue_req(conn)
                if held:
                    # The body the event loop read is answered: out of the budget now, not when
                    # the handed-on request ends (a bind may wait seconds on the API server).
                    self.method_queue.defer(self._release, held)
                return HANDED_ON
            verb = next_verb

    def _release(self, held: int) -> None:
        self.inflight -= held

    def _pool(self, verb: str | None) -> futures.Executor:
        """The threads that serve ``verb``: the bind verb's own, or gunicorn's."""
        return self.bind_pool if verb == "bind" and self.bind_pool is not None else self.tpool

    def _answer(self, conn: FrontConn, verb: str, body: bytes | bytearray) -> bool:
        self.nr += 1
        keep = (
            self.alive
            and bool(self.cfg.keepalive)
            and not conn.close_after
            and self.nr < self.max_requests
            and len(self.keepalived_conns) < self.max_keepalived
        )
        if self.nr >= self.max_requests and self.alive:
            self.log.info("Autorestarting worker after current request.")
            self.alive = False
        try:
            status, payload = self.endpoint.serve(verb, len(body), lambda _size: body)
        except Exception:  # counting the failure failed too: still an answer, never a silent hang
            self.log.exception("internal error serving %s", verb)
            status, payload, keep = 500, b'{"Error":"internal error"}', False
        head = (
            f"HTTP/1.1 {REASONS.get(status, f'{status} Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n{'' if keep else 'Connection: close' + chr(13) + chr(10)}\r\n"
        )
        try:
            conn.sock.settimeout(self.request_timeout)
            if len(payload) < 65536:
                conn.sock.sendall(head.encode() + payload)  # one segment
            else:  # Nodes mode's megabytes: not copied once more to go after the head
                conn.sock.sendall(head.encode())
                conn.sock.sendall(payload)
        except (OSError, ssl.SSLError) as e:
            self.log.debug("Closing connection: %s", e)
            return False
        return keep

    def _next_request(self, conn: FrontConn) -> tuple[str, bytes | bytearray, bool] | None:
        """The next request if it comes whole within NEXT_REQUEST_SECONDS: (verb, body, close).

        A request of up to RECV_BYTES that comes in pieces is read on while they come within
        that time (at 1,000 names and more, kube-scheduler's body comes in several); a larger
        one is read by the event loop, within its budget for bodies. None otherwise; the bytes
        read, if any, are left in ``conn.pipelined`` for the event loop.
        """
        sock = conn.sock
        deadline = time.monotonic() + NEXT_REQUEST_SECONDS
        data = bytearray()
        head_end = -1  # where the head ends, once it is all here
        need = -1  # the bytes of the whole request, head and body, once the head is here
        try:
            poll = select.poll()
            poll.register(sock, select.POLLIN)
            sock.setblocking(False)  # never wait in recv: _answer sets the timeout again
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not poll.poll(1000 * left):
                    break
                try:
                    chunk = sock.recv(RECV_BYTES)
                except (BlockingIOError, InterruptedError):
                    continue
                if not chunk:
                    conn.ended = not data  # closed by the client: finish_request closes it too
                    break
                data += chunk
                if need < 0:
                    end = data.find(b"\r\n\r\n")
                    if end < 0:
                        if len(data) > MAX_HEAD_BYTES:
                            break
                        continue
                    head_end = end + 4
                    if head_end > MAX_HEAD_BYTES:
                        break  # the event loop's 431
                    length, problem = _body_length(bytes(data[:head_end]), self.head_limits)
                    if problem is not None or length is None or length > self.max_body:
                        break  # the event loop's rules answer it
                    need = head_end + length
                    if need > RECV_BYTES:
                        break  # (Nodes mode's megabytes): read under the event loop's budget for bodies
                    if len(data) < need and b"100-continue" in data[:head_end].lower():
                        break  # its body waits for the event loop's 100 Continue
                if len(data) >= need:
                    break
        except (OSError, ValueError):
            conn.pipelined = data
            return None  # the event loop finds the connection broken and drops it
        conn.pipelined = data
        if need < 0 or len(data) != need:
            return None  # nothing, not all of it in time, more than one, or the event loop's to answer
        verb, close = _direct_verb(bytes(data[:head_end]), self.verb_prefix)
        if verb is None:
            return None
        conn.pipelined = b""
        return verb, data[head_end:], close

    def finish_request(self, conn: FrontConn, fs: Any) -> None:
        self.inflight -= conn.held
        conn.held = 0
        try:
            keep = fs.result() if not fs.cancelled() else False
        except Exception:
            keep = False
        try:
            if keep:
                # The reply announced keep-alive, so the client may be sending its next request
                # already: a stopping worker keeps the connection too, for STOP_KEEPALIVE_LINGER
                # at most, and answers that request with "Connection: close" (as gthread does)
                # instead of dropping it.
                pipelined = getattr(conn, "pipelined", b"")
                conn.pipelined = b""
                conn.sock.setblocking(False)
                if pipelined:
                    self._start_reading(conn, bytearray(pipelined))
                    return
                conn.set_timeout()
                if not self.alive:
                    conn.timeout = min(conn.timeout, time.monotonic() + STOP_KEEPALIVE_LINGER)
                self.keepalived_conns.append(conn)
                self.poller.register(conn.sock, selectors.EVENT_READ, partial(self.on_client_socket_readable, conn))
            elif conn.ended:  # nothing left to drain, nothing to wait for
                self.nr_conns -= 1
                conn.close()
            else:
                self._linger(conn)
        except Exception:
            self.nr_conns -= 1
            conn.close()


def bind_pool(config: ExtenderConfig) -> futures.ThreadPoolExecutor | None:
    """The bind verb's own threads, where a bind waits on the API server (see enqueue_req).

    None where it does not: binds are then served by the decisions' threads (``server.threads``),
    and a connection's bind and next decision by the same thread, without the hand-over between
    pools (about 0.15 ms of the extender's CPU a pod at 100 nodes with ``bind.write: false``,
    docs/benchmarks.md, "Binds that write nothing, on the decisions' threads"). The pool starts
    its threads as needed.
    """
    if not (config.bind_enabled and config.bind_write):
        return None
    return futures.ThreadPoolExecutor(config.bind_threads, thread_name_prefix="bind")


_OPEN_PATHS = (b"/healthz", b"/readyz", b"/metrics")
_RDHUP = getattr(select, "POLLRDHUP", 0)  # Linux; elsewhere a reset or error only
_HUNG_UP = _RDHUP | select.POLLHUP | select.POLLERR


def _hung_up(sock: socket.socket) -> bool:
    """Whether the client has closed (or reset) the connection, whatever it sent before.

    ``POLLRDHUP``: the peer's FIN has arrived, read or not, on TLS sockets too (a TLS close
    leaves an alert in the buffer, so an empty read would not tell); ``POLLHUP``/``POLLERR``:
    reset or broken. A client that half-closes after its request and still waits for the
    answer counts as gone, as nginx counts it (499); kube-scheduler's Go client never
    half-closes: it closes when it gives up.
    """
    try:
        poll = select.poll()
        poll.register(sock, _RDHUP)
        return any(events & _HUNG_UP for _, events in poll.poll(0))
    except (OSError, ValueError):  # (a closed socket's fileno is -1)
        return True


def _direct_verb(head: bytes, prefix: bytes) -> tuple[str | None, bool]:
    """(verb, Connection: close asked) for ``POST {prefix}<verb> HTTP/1.1``; (None, False) otherwise."""
    line, _, headers = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3 or parts[0] != b"POST" or parts[2] != b"HTTP/1.1" or not parts[1].startswith(prefix):
        return None, False
    verb = parts[1][len(prefix) :]
    if not verb or not verb.isascii() or not verb.replace(b"_", b"").isalnum():
        return None, False  # a query, a deeper path, an odd byte: gunicorn and Flask answer it
    close = False
    for header in headers.split(b"\r\n"):
        name, sep, value = header.partition(b":")
        if sep and name.strip().lower() == b"connection":
            close = close or b"close" in value.lower()
    return verb.decode(), close


_TOKEN_START = re.compile(_TOKEN)
_REQUEST_LINE = re.compile(_TOKEN + rb"+ [^ \r\n]+ HTTP/[0-9]\.[0-9]\r")


def _request_line_problem(buf: bytes | bytearray, line_limit: int = GUNICORN_DEFAULTS.line) -> tuple[int, str, str] | None:
    """Why the start of a request whose head is not all here yet can never be an HTTP/1.x request,
    as ``(status, reason, message)`` (None: it may still be one). A TLS handshake sent to a
    plain-HTTP port, a request line ended by a bare LF, or one still arriving that is already
    over ``limit_request_line``, waited for the read deadline and got 408 (or, for the last, for
    64 KiB); gunicorn's parser answers them at once, with 400 and 414, and so does this."""
    first = buf[:1]
    if not first or first in (b"\r", b"\n"):
        return None  # (an empty line before the request line is allowed, RFC 9112 section 2.2)
    if first[0] == 0x16:
        return 400, "bad_request_line", "a TLS handshake on a plain-HTTP port: serve TLS (server.tls) or call the extender over HTTP"
    if not _TOKEN_START.match(first):
        return 400, "bad_request_line", "not an HTTP/1.x request"
    nl = buf.find(b"\n")
    # gunicorn's read_line: a line over the limit is refused once its CRLF has come, or once it is
    # longer than the limit by the CRLF that may be all that is missing
    length = (nl - 1 if buf[nl - 1 : nl] == b"\r" else nl) if nl >= 0 else len(buf) - 2
    if line_limit and length > line_limit:
        said = length if nl >= 0 else len(buf)  # as gunicorn says it
        return 414, "malformed", f"malformed request: Request Line is too large ({said} > {line_limit})"
    if nl >= 0 and not _REQUEST_LINE.fullmatch(buf, 0, nl):
        return 400, "bad_request_line", "malformed request line: METHOD TARGET HTTP/1.1, ended by CRLF"
    return None


def _open_to_all(head: bytes) -> bool:
    """GET of a probe or of the metrics: served without a client certificate (kubelet, Prometheus)."""
    method, _, rest = head.partition(b" ")
    target = rest.partition(b" ")[0].partition(b"?")[0]
    return method in (b"GET", b"HEAD") and target in _OPEN_PATHS


def _body_length(head: bytes, limits: HeadLimits = GUNICORN_DEFAULTS) -> tuple[int | None, tuple[int, str, str] | None]:
    """The body length a request head announces (None: malformed, left to gunicorn's parser).

    A head gunicorn's parser would refuse is malformed here too, so that a request refused on
    gunicorn's path is not answered on the direct verb path: a request line or a header line
    (with its CRLF, as gunicorn counts it) over its limit, more header lines than its limit (414,
    431), a header line whose name is not an RFC 9110 token followed by a colon, or whose value
    holds a NUL, CR or LF (400).
    """
    lines = head.split(b"\r\n")
    if (limits.line and len(lines[0]) > limits.line) or (limits.fields and len(lines) - 3 > limits.fields):
        return None, None  # (the head's last two "lines" are the empty ones its CRLF CRLF ends with)
    if not _HEADER_LINES.fullmatch(head, len(lines[0]) + 2):
        return None, None
    size = (limits.field_size or len(head)) - 2
    length: int | None = 0
    seen = False
    for line in lines[1:-2]:
        if len(line) > size:
            return None, None
        name, _, value = line.partition(b":")
        name = name.lower()
        if name == b"transfer-encoding":
            return None, (
                411,
                "length_required",
                "Transfer-Encoding is not accepted: send the body with Content-Length",
            )
        if name == b"content-length":
            value = value.strip()
            if seen or not value.isdigit():
                return None, None
            seen = True
            # The number gunicorn's parser reads from the same digits (a body read by a pool
            # thread holds it): leading zeros count for nothing, and past int()'s 4,300 digits
            # it reads none, refusing the header (400).
            if len(value) > 4300:
                return None, None
            value = value.lstrip(b"0") or b"0"
            length = int(value) if len(value) <= 18 else 10**18
    return length, None
