"""The HTTP face of the extender (Flask), served by gunicorn in production.

Routes (``{prefix}`` defaults to ``/scheduler``):

* ``POST {prefix}/filter``, ``{prefix}/prioritize``, ``{prefix}/preempt``, ``{prefix}/bind``
  — the kube-scheduler extender verbs (see ``extender/wire.py``);
* ``POST {prefix}/explain`` — the same ExtenderArgs, answered with the why of every score;
* ``GET /healthz`` (alive), ``GET /readyz`` (a profile source answered), ``GET /metrics``.

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

import orjson
from flask import Flask, Response, request

from extender import wire
from extender.config import ExtenderConfig
from extender.metrics import ExtenderMetrics, NodeGaugeWriter
from extender.predicted import PredictedLoad
from extender.profiles import FileSource, PrometheusSource, ProfileSource
from extender.service import BindDisabled, Extender
from policy.errors import PolicyError

log = logging.getLogger(__name__)

JSON = "application/json"
VERBS = ("filter", "prioritize", "preempt", "bind", "explain")


def _json(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), status=status, mimetype=JSON)


def make_source(config: ExtenderConfig) -> ProfileSource:
    if config.source == "prometheus":
        return PrometheusSource(
            config.prometheus_url, config.prometheus_cache_seconds, config.prometheus_timeout_seconds
        )
    return FileSource(config.file_path, config.file_reload_seconds)


def make_binder(config: ExtenderConfig) -> Callable[[wire.BindingArgs], None]:
    from extender.kube import Binder

    return Binder(config.kubeconfig)


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
    binder = make_binder(config) if config.bind_enabled else None
    ext = Extender(source, config.policy, predicted, clock=clock, binder=binder)
    gauges = NodeGaugeWriter(metrics, lambda: ext.last)
    if background:
        gauges.start()
        if config.watch_pods:
            from extender.kube import PodBindingWatch

            PodBindingWatch(config.kubeconfig, predicted, clock).start()

    app = Flask("joulesched-extender")
    app.config["MAX_CONTENT_LENGTH"] = config.max_request_bytes
    app.extensions["joulesched"] = {"extender": ext, "metrics": metrics, "gauges": gauges, "config": config}
    prefix = config.prefix.rstrip("/")
    handlers: dict[str, Callable[[bytes], Any]] = {
        "filter": ext.filter,
        "prioritize": ext.prioritize,
        "preempt": ext.preempt,
        "bind": ext.bind,
        "explain": ext.explain,
    }
    source_errors_seen = [0]

    def fail(verb: str, status: int, reason: str, message: str) -> Response:
        metrics.failures.labels(verb, reason).inc()
        metrics.requests.labels(verb, str(status)).inc()
        return _json({"Error": message}, status)

    @app.post(f"{prefix}/<verb>")
    def extender_verb(verb: str) -> Response:
        started = time.perf_counter()
        handler = handlers.get(verb)
        if handler is None:
            return fail("unknown", 404, "unknown_verb", f"unknown verb {verb!r}: use one of {', '.join(VERBS)}")
        length = request.content_length
        if length is not None and length > config.max_request_bytes:
            return fail(verb, 413, "too_large", f"request body of {length} bytes is over max_request_bytes ({config.max_request_bytes})")
        try:
            body = request.get_data(cache=False)
        except Exception as err:  # werkzeug raises RequestEntityTooLarge for streamed bodies
            return fail(verb, 413, "too_large", f"request body over max_request_bytes ({config.max_request_bytes}): {err}")
        try:
            result = handler(body)
        except (wire.WireError, PolicyError) as err:
            log.info("%s: bad request: %s", verb, err)
            return fail(verb, 400, "bad_request", str(err))
        except BindDisabled as err:
            return fail(verb, 404, "bind_disabled", str(err))
        except Exception as err:  # never a crashed worker: a 500 with the cause, and counted
            log.exception("%s: internal error", verb)
            return fail(verb, 500, "internal", f"internal error: {type(err).__name__}: {err}")
        response = _json(result)
        metrics.requests.labels(verb, "200").inc()
        metrics.latency.labels(verb).observe(time.perf_counter() - started)
        errors = getattr(source, "errors", 0)
        if errors != source_errors_seen[0]:
            metrics.source_errors.labels(source.name).inc(errors - source_errors_seen[0])
            source_errors_seen[0] = errors
        if verb in ("filter", "prioritize") and ext.last is not None:
            ev = ext.last.evaluation
            unknown = int((~ev.known).sum())
            stale = int((ev.known & ~ev.fresh).sum())
            if unknown:
                metrics.neutral.labels("unknown").inc(unknown)
            if stale:
                metrics.neutral.labels("stale").inc(stale)
            if verb == "filter" and ev.failed.any():
                metrics.filtered.labels("power_cap").inc(int(ev.failed.sum()))
            metrics.predicted_pods.set(len(predicted))
        return response

    @app.route(f"{prefix}/<verb>", methods=["GET", "PUT", "DELETE", "PATCH"])
    def wrong_method(verb: str) -> Response:
        return fail(verb if verb in VERBS else "unknown", 405, "method", f"{request.method} {request.path}: extender verbs take POST")

    @app.get("/healthz")
    def healthz() -> Response:
        return Response("ok\n", mimetype="text/plain")

    @app.get("/readyz")
    def readyz() -> Response:
        snap = source.snapshot()
        if snap.ready:
            return Response(f"ok: {len(snap.profiles.nodes)} node profiles from {source.name}\n", mimetype="text/plain")
        return Response(f"not ready: no answer yet from the {source.name} profile source {snap.error}\n", 503, mimetype="text/plain")

    @app.get("/metrics")
    def metrics_endpoint() -> Response:
        return Response(metrics.exposition(), mimetype="text/plain; version=0.0.4; charset=utf-8")

    @app.errorhandler(404)
    def not_found(err: Exception) -> Response:
        return _json({"Error": f"no such path {request.path!r}; extender verbs are under {prefix}/"}, 404)

    @app.errorhandler(405)
    def not_allowed(err: Exception) -> Response:
        return _json({"Error": f"{request.method} is not allowed on {request.path}"}, 405)

    @app.errorhandler(413)
    def too_large(err: Exception) -> Response:
        metrics.failures.labels("unknown", "too_large").inc()
        return _json({"Error": f"request body over max_request_bytes ({config.max_request_bytes})"}, 413)

    return app


def extender_of(app: Flask) -> Extender:
    ext: Extender = app.extensions["joulesched"]["extender"]
    return ext
