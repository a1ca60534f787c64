"""The HTTP face of the extender (Flask), served by gunicorn in production.

Routes (``{prefix}`` defaults to ``/scheduler``):

* ``POST {prefix}/filter``, ``{prefix}/prioritize``, ``{prefix}/preempt``, ``{prefix}/bind``
  — the kube-scheduler extender verbs (see ``extender/wire.py``);
* ``POST {prefix}/explain`` — the same ExtenderArgs, answered with the why of every score;
* ``GET /healthz`` (alive), ``GET /readyz`` (the profile source answered and not every profile
  is stale past ``policy.max_age_seconds``), ``GET /metrics``.

Every failure is an HTTP error with a JSON body ``{"Error": "..."}`` naming what is wrong —
400 for bad input, 404 for an unknown verb, 405 for a wrong method, 413 for a body over
``max_request_bytes`` — and is counted in ``joulesched_extender_failures_total``:
kube-scheduler logs prioritize failures only at high verbosity, so our metrics are where an
operator sees them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
from flask import Flask, Response, request
from prometheus_client import Gauge

from joulesched.extender import wire
from joulesched.extender.config import ExtenderConfig
from joulesched.extender.errors import BindDisabled, WireError
from joulesched.extender.logsafe import RateLimitedLog, escape
from joulesched.extender.metrics import VERBS, ExtenderMetrics, NodeGaugeWriter, ProfileStatus
from joulesched.extender.predicted import Occupancy, PredictedLoad, Unbound
from joulesched.extender.profiles import FileSource, ProfileSource, PrometheusSource
from joulesched.extender.service import Extender, scheduler_binds
from joulesched.policy.config import FILTER_KEEPS
from joulesched.policy.errors import PolicyError

log = logging.getLogger(__name__)

JSON = "application/json"


def make_source(config: ExtenderConfig) -> ProfileSource:
    if config.source == "prometheus":
        return PrometheusSource(
            config.prometheus_url,
            config.prometheus_cache_seconds,
            config.prometheus_timeout_seconds,
            selector=config.prometheus_selector,
        )
    if config.source == "tenant":
        from joulesched.extender.tenant import TenantSource

        return TenantSource(config.tenant)
    return FileSource(config.file_path, config.file_reload_seconds)


def make_binder(config: ExtenderConfig, in_flight: Gauge) -> Callable[[wire.BindingArgs], None]:
    """What the bind verb does once the placement is recorded: the API write, counted in
    ``in_flight`` while the API server has it; with ``bind.write: false``, nothing (kube-scheduler writes)."""
    if not config.bind_write:
        return scheduler_binds
    from joulesched.extender.kube import Binder

    return _in_flight(Binder(config.kubeconfig), in_flight)


def _in_flight(binder: Callable[[wire.BindingArgs], None], gauge: Gauge) -> Callable[[wire.BindingArgs], None]:
    """``binder``, counted in ``gauge`` while the API server has its binding."""

    def bind(args: wire.BindingArgs) -> None:
        with gauge.track_inprogress():
            binder(args)

    return bind


def create_app(
    config: ExtenderConfig | None = None,
    *,
    source: ProfileSource | None = None,
    metrics: ExtenderMetrics | None = None,
    clock: Callable[[], float] = time.time,
    background: bool = True,
) -> Flask:
    """Build the WSGI app. ``background=False`` starts no threads (tests drive them)."""
    config = config or ExtenderConfig()
    source = source or make_source(config)
    metrics = metrics or ExtenderMetrics()
    predicted = PredictedLoad(config.predicted_ttl_seconds, config.predicted_settle_seconds)
    occupancy = Occupancy() if config.watch_pods else None
    binder = make_binder(config, metrics.binds_in_flight) if config.bind_enabled else None

    def waited(outcome: str, seconds: float) -> None:
        metrics.bind_waits.labels(outcome).inc()
        metrics.bind_wait_seconds.labels(outcome).inc(seconds)

    unbound = Unbound(config.bind_wait_seconds if config.bind_enabled else 0.0, on_wait=waited)
    kept = {what: metrics.filter_kept.labels(what) for what in FILTER_KEEPS}  # all exported from the start
    ext = Extender(
        source,
        config.policy,
        predicted,
        clock=clock,
        binder=binder,
        server_id_label=config.server_id_label,
        occupancy=occupancy,
        unbound=unbound,
        on_filter_kept=lambda what: kept[what].inc(),
    )
    max_age = config.policy.max_age_seconds

    def status() -> ProfileStatus | None:
        snap = source.snapshot()
        if not snap.ready:
            return None
        now = clock()
        stale = snap.stale_count(now, max_age)
        return ProfileStatus(max(0.0, now - snap.loaded_at), len(snap.profiles.nodes) - stale, stale)

    gauges = NodeGaugeWriter(metrics, lambda: ext.last, status=status)
    if config.watch_pods or config.watch_nodes or config.bind_enabled:
        from joulesched.extender.kube import preload

        preload()
    if background:
        gauges.start()
        if config.watch_pods:
            from joulesched.extender.kube import PodBindingWatch

            PodBindingWatch(config.kubeconfig, predicted, clock, occupancy, unbound).start()
        if config.watch_nodes:
            from joulesched.extender.kube import NodeServerWatch

            NodeServerWatch(config.kubeconfig, config.server_id_label, ext).start()

    # static_folder=None: no implicit /static route serving files from the working directory
    app = Flask("joulesched-extender", static_folder=None)
    app.extensions["joulesched"] = {"extender": ext, "metrics": metrics, "gauges": gauges, "config": config}
    prefix = config.prefix.rstrip("/")
    endpoint = VerbEndpoint(ext, metrics, source, config.max_request_bytes)
    app.extensions["joulesched"]["endpoint"] = endpoint  # the worker counts the requests it refuses itself

    @app.route(f"{prefix}/<verb>", methods=["GET", "PUT", "DELETE", "PATCH"])
    def wrong_method(verb: str) -> Response:
        status, body = endpoint.fail(verb if verb in VERBS else "unknown", 405, "method", f"{request.method} {request.path}: extender verbs take POST")
        return Response(body, status, mimetype=JSON)

    @app.get("/healthz")
    def healthz() -> Response:
        return Response("ok\n", mimetype="text/plain")

    @app.get("/readyz")
    def readyz() -> Response:
        snap = source.snapshot()
        endpoint.count_source_errors()
        if not snap.ready:
            return Response(f"not ready: no answer yet from the {source.name} profile source {snap.error}\n", 503, mimetype="text/plain")
        st = status()
        assert st is not None
        total = st.fresh + st.stale
        said = f"{total} node profiles from {source.name}, {st.stale} stale (measured over {max_age:g} s ago), read {st.age_seconds:.0f} s ago"
        if snap.error:
            said += f"; the last refresh failed: {escape(snap.error)}"
        if total and not st.fresh:  # every node would score neutral: let kube-scheduler go without us
            return Response(f"not ready: {said}\n", 503, mimetype="text/plain")
        return Response(f"ok: {said}\n", mimetype="text/plain")

    @app.get("/metrics")
    def metrics_endpoint() -> Response:
        endpoint.count_source_errors()  # refreshes /readyz made (the kubelet's probes), without traffic
        return Response(metrics.exposition(), mimetype="text/plain; version=0.0.4; charset=utf-8")

    # Counted like every other error (verb "other"): with a wrong urlPrefix in kube-scheduler's
    # extender entry every call ends here, and the failures are what an alert sees.
    @app.errorhandler(404)
    def not_found(err: Exception) -> Response:
        message = f"no such path {request.path!r}; extender verbs are under {prefix}/"
        status, body = endpoint.fail("other", 404, "unknown_path", message)
        return Response(body, status, mimetype=JSON)

    @app.errorhandler(405)
    def not_allowed(err: Exception) -> Response:
        status, body = endpoint.fail("other", 405, "method", f"{request.method} is not allowed on {request.path}")
        return Response(body, status, mimetype=JSON)

    @app.errorhandler(500)
    def internal(err: Exception) -> Response:  # a bug in a Flask route: JSON and counted, like the verbs'
        cause = getattr(err, "original_exception", None) or err
        status, body = endpoint.fail("other", 500, "internal", f"internal error: {type(cause).__name__}")
        return Response(body, status, mimetype=JSON)

    app.wsgi_app = VerbFastPath(app.wsgi_app, prefix, endpoint)  # type: ignore[method-assign]
    return app


class VerbEndpoint:
    """``POST {prefix}/<verb>``: read the body, run the verb, count it, answer JSON.

    Errors are HTTP statuses with ``{"Error": ...}``; nothing raised here reaches gunicorn.
    """

    def __init__(self, ext: Extender, metrics: ExtenderMetrics, source: ProfileSource, max_bytes: int) -> None:
        self.ext = ext
        self.metrics = metrics
        self.source = source
        self.max_bytes = max_bytes
        self.handlers: dict[str, Callable[[bytes], Any]] = {
            "filter": ext.filter,
            "prioritize": ext.prioritize,
            "preempt": ext.preempt,
            "bind": ext.bind,
            "explain": ext.explain,
        }
        self._source_errors_seen = 0
        self.bad_request_log = RateLimitedLog(log)
        # The labelled children of the success path, looked up once: labels() costs more than
        # a 100-node policy evaluation.
        self._ok = {verb: (metrics.requests.labels(verb, "200"), metrics.latency.labels(verb)) for verb in self.handlers}
        # at 0 from the start, as the other counters (extender/metrics.py): the first failed
        # refresh shows in increase()
        self._source_errors = metrics.source_errors.labels(source.name)

    def fail(self, verb: str, status: int, reason: str, message: str, started: float | None = None) -> tuple[int, bytes]:
        """Count a request answered with an error; with ``started`` (the verb endpoint's
        :func:`time.perf_counter` when it took the request), observe its latency too."""
        self.metrics.failures.labels(verb, reason).inc()
        self.metrics.requests.labels(verb, str(status)).inc()
        if started is not None:
            self.metrics.latency.labels(verb).observe(time.perf_counter() - started)
        return status, orjson.dumps({"Error": message})

    def __call__(self, verb: str, length: int | None, read: Callable[[int], bytes]) -> tuple[int, bytes]:
        started = time.perf_counter()
        handler = self.handlers.get(verb)
        if handler is None:
            return self.fail("unknown", 404, "unknown_verb", f"unknown verb {verb!r}: use one of {', '.join(VERBS)}", started)
        if length is not None and length > self.max_bytes:
            return self.fail(verb, 413, "too_large", f"request body of {length} bytes is over max_request_bytes ({self.max_bytes})", started)
        body = read(self.max_bytes + 1 if length is None else length)
        if len(body) > self.max_bytes:
            return self.fail(verb, 413, "too_large", f"request body over max_request_bytes ({self.max_bytes})", started)
        try:
            result = handler(body)
            # serialised inside the error path: a reply orjson cannot write is a counted 500
            payload = result if isinstance(result, wire.Encoded) else orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY)
        except (WireError, PolicyError) as err:
            self.bad_request_log.log(logging.INFO, f"{verb}:bad_request", "%s: bad request: %s", verb, str(err))
            return self.fail(verb, 400, "bad_request", str(err), started)
        except RecursionError:  # a document nested deeper than any Kubernetes object is
            self.bad_request_log.log(logging.INFO, f"{verb}:too_deep", "%s: bad request: nested too deeply", verb)
            return self.fail(verb, 400, "bad_request", "request body is nested too deeply", started)
        except BindDisabled as err:
            return self.fail(verb, 404, "bind_disabled", str(err), started)
        except Exception as err:  # never a crashed worker: a 500 with the cause, and counted
            log.exception("%s: internal error", verb)
            return self.fail(verb, 500, "internal", f"internal error: {type(err).__name__}: {escape(str(err))}", started)
        self._count(verb, time.perf_counter() - started)
        return 200, payload

    def abandon(self, verb: str, body: bytes | bytearray) -> None:
        """A request whose client closed the connection before a thread took it: not served.

        kube-scheduler closes a connection when its httpTimeout passes, and has then gone on
        without the answer. Counted as ``code="499"`` (nginx's "client closed request") and
        ``reason="client_gone"``. A bind's placement is still recorded, its binding not sent
        (:meth:`Extender.bind`); a decision is not evaluated.
        """
        if verb not in self.handlers:
            verb = "unknown"
        self.fail(verb, 499, "client_gone", "the client closed the connection before the request was served")
        if verb == "bind" and self.ext.binder is not None:
            try:
                self.ext.bind(bytes(body), send=False)
            except (WireError, PolicyError):
                pass  # a bind nobody waits for, and malformed: nothing to record
            except Exception:  # nobody to answer: logged, never lost in the worker's future
                log.exception("recording the placement of an abandoned bind")

    def serve(self, verb: str, length: int | None, read: Callable[[int], bytes]) -> tuple[int, bytes]:
        """:meth:`__call__`, and a JSON 500 for anything that escapes it (reading the body, counting)."""
        try:
            return self(verb, length, read)
        except Exception as err:  # never gunicorn's HTML
            log.exception("internal error outside a verb")
            return self.fail("other", 500, "internal", f"internal error: {type(err).__name__}")

    def count_source_errors(self) -> None:
        """Carry the profile source's failed refreshes into its counter: after each verb, and at
        each /readyz and /metrics, so a file that breaks while no pod is scheduled is counted too."""
        errors = self.source.errors
        if errors != self._source_errors_seen:
            self._source_errors.inc(errors - self._source_errors_seen)
            self._source_errors_seen = errors

    def _count(self, verb: str, seconds: float) -> None:
        m = self.metrics
        requests, latency = self._ok[verb]
        requests.inc()
        latency.observe(seconds)
        self.count_source_errors()
        last = self.ext.last
        if verb in ("filter", "prioritize") and last is not None:
            ev = last.evaluation
            unknown = len(ev.known) - int(np.count_nonzero(ev.known))
            stale = int(np.count_nonzero(ev.known)) - int(np.count_nonzero(ev.fresh))
            invalid = last.snapshot.invalid
            if unknown and invalid:  # left out for a non-finite or out-of-range sample
                bad = sum(1 for name, row in zip(last.args.node_names, last.rows.tolist(), strict=True) if row < 0 and name in invalid)
                if bad:
                    m.neutral.labels("invalid").inc(bad)
                    unknown -= bad
            if unknown:
                m.neutral.labels("unknown").inc(unknown)
            if stale:
                m.neutral.labels("stale").inc(stale)
            if verb == "filter" and ev.failed.any():
                m.filtered.labels("power_cap").inc(int(np.count_nonzero(ev.failed)))
            m.predicted_pods.set(len(self.ext.predicted))


class VerbFastPath:
    """WSGI middleware: ``POST {prefix}/<verb>`` goes straight to :class:`VerbEndpoint`.

    The scheduling path skips Flask's request context and routing, which cost more than the
    policy itself for a 100-node request (docs/benchmarks.md); every other path — health,
    readiness, metrics, wrong methods, unknown paths — is Flask's. Under the extender's own
    gunicorn worker (extender/worker.py) the verbs do not even reach WSGI; this path serves
    them under any other server.
    """

    def __init__(self, app: Any, prefix: str, endpoint: VerbEndpoint) -> None:
        self.app = app
        self.verb_prefix = prefix + "/"
        self.endpoint = endpoint

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path: str = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") != "POST" or not path.startswith(self.verb_prefix) or "/" in path[len(self.verb_prefix) :]:
            return self.app(environ, start_response)
        raw_length = environ.get("CONTENT_LENGTH")
        try:
            length = int(raw_length) if raw_length else None
        except ValueError:
            length = None
        status, body = self.endpoint.serve(path[len(self.verb_prefix) :], length, environ["wsgi.input"].read)
        start_response(wire.REASONS.get(status, f"{status} Error"), [("Content-Type", JSON), ("Content-Length", str(len(body)))])
        return [body]


def extender_of(app: Flask) -> Extender:
    ext: Extender = app.extensions["joulesched"]["extender"]
    return ext
