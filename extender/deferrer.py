"""``joulesched deferrer``: release gated pods at the cleanest hour of their window.

::

    joulesched deferrer --site-file FILE [--kubeconfig FILE] [--namespace NS] [--interval S]
                        [--listen HOST:PORT] [--no-leader-elect] [--lease-namespace NS] ...
                        [--webhook-listen HOST:PORT --tls-cert FILE --tls-key FILE]
                        [--clock-offset SECONDS]

A pod opts in with a deadline (``joulesched.io/deadline``, RFC 3339, or
``joulesched.io/max-delay-seconds`` from its creation) and the scheduling gate
``joulesched.io/deferred`` set at creation (by its author, or by the webhook of
:mod:`extender.admission`). kube-scheduler leaves a gated pod Pending. The deferrer watches the
unscheduled pods, and every ``--interval`` seconds asks :func:`policy.deferral.decide` — the one
release rule the simulator uses too — about each gated one, under the intensity of the pod's
site: the site its nodeSelector or required node affinity on ``joulesched.io/site`` names, or
the pointwise lowest of every site of the site file (:class:`policy.deferral.LowestOf`) when it
may run anywhere. Released means that one gate removed, nothing else.

The only write to a pod is one JSON patch whose first operation tests the exact gate list it
was decided on: when another deferrer (a second leader in a split brain, a replica whose cache
lagged) or anyone else has changed the gates since, the patch fails as a whole, so no pod is
released twice and no other controller's gate is lost. Leader election over a
coordination.k8s.io Lease keeps one replica active; the standby takes over once the Lease has
not been renewed for its duration.

Bad input never holds a pod: malformed annotations, or a gate without any deadline, release the
pod at once (reason ``invalid``) with a Warning Event naming the annotation.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from joulesched.contracts import names as m
from joulesched.contracts.cliargs import number
from joulesched.extender.errors import DeferrerError, ExtenderError
from joulesched.extender.kube import ListWatch, listing_version, watch_events
from joulesched.policy.deferral import (
    DEFAULT_STEP,
    DEFAULT_TOLERANCE,
    GATE,
    Decision,
    Deferral,
    LowestOf,
    decide,
    deferral_from_pod,
    mean_over_runs,
)
from joulesched.policy.demand import demand_from_pod
from joulesched.policy.errors import PolicyError
from joulesched.policy.site import (
    CarbonIntensitySource,
    SiteCatalogue,
    WithFallback,
)
from joulesched.policy.units import JOULES_PER_KWH

log = logging.getLogger(__name__)

COMPONENT = "joulesched-deferrer"  # field manager, Event source, Lease name
RELEASE_REASONS = ("clean", "deadline", "expired", "no_forecast", "invalid")
# Marginal watts of one busy core: the shipped EPYC 7763 curve (deploy/extender profiles,
# 56.8 W idle, 268 W at 64 busy cores) gives (268 - 56.8) / 64 = 3.3 W.
DEFAULT_WATTS_PER_CORE = 3.3
SECONDS = number(above=0, unit="seconds")  # the deferrer's periods


# -- reading pods ---------------------------------------------------------------------------------


def gates_of(pod: Mapping[str, Any]) -> list[Any]:
    return list((pod.get("spec") or {}).get("schedulingGates") or [])


def is_gated(pod: Mapping[str, Any]) -> bool:
    return any(isinstance(g, Mapping) and g.get("name") == GATE for g in gates_of(pod))


def created_at(pod: Mapping[str, Any]) -> float:
    raw = (pod.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(raw, str):
        raise PolicyError("Pod metadata.creationTimestamp: missing")
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError as err:
        raise PolicyError(f"Pod metadata.creationTimestamp: not RFC 3339: {raw[:40]!r}") from err


def pod_sites(pod: Mapping[str, Any], label: str = m.SITE_LABEL) -> tuple[str, ...] | None:
    """The sites a pod may run at by its nodeSelector and required node affinity on ``label``;
    ``None`` when it may run at any site."""
    spec = pod.get("spec") or {}
    selected = (spec.get("nodeSelector") or {}).get(label)
    allowed: set[str] | None = {selected} if isinstance(selected, str) else None
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = affinity.get("nodeSelectorTerms") or []
    if terms:
        union: set[str] = set()
        for term in terms:  # terms are ORed: any term without a site restriction allows every site
            values = None
            for expr in term.get("matchExpressions") or []:  # ANDed within a term
                if expr.get("key") == label and expr.get("operator") == "In":
                    vals = set(expr.get("values") or [])
                    values = vals if values is None else values & vals
            if values is None:
                union = set()
                break
            union |= values
        else:
            allowed = union if allowed is None else allowed & union
    return None if allowed is None else tuple(sorted(allowed))


def _forecast(source: CarbonIntensitySource) -> CarbonIntensitySource:
    """A site's source as a forecast: its fallback constant is not one.

    A site's ``fallback`` answers where its series or API cannot (scoring and reports must not
    stop); for deferral that constant past the forecast's horizon would read as a prediction and
    could hold a pod for an hour nobody forecast. Past the horizon the rule sees no candidate
    instead, and a pod whose run now is not covered at all is released (``no_forecast``).
    """
    while isinstance(source, WithFallback):
        source = source.primary
    return source


def forecast_for(catalogue: SiteCatalogue, sites: tuple[str, ...] | None) -> tuple[CarbonIntensitySource | None, str]:
    """The intensity forecast for a pod that may run at ``sites`` (``None``: any), and its name."""
    if sites is None:
        sources = tuple(_forecast(s.carbon) for s in catalogue.sites.values())
        where = "any site"
    else:
        unknown = [s for s in sites if s not in catalogue.sites]
        if unknown or not sites:
            return None, f"site {', '.join(unknown) or '(none)'} is not in the site file"
        sources = tuple(_forecast(catalogue.sites[s].carbon) for s in sites)
        where = ", ".join(sites)
    if not sources:
        return None, "the site file has no sites"
    return (sources[0] if len(sources) == 1 else LowestOf(sources)), where


def release_patch(gates: Sequence[Any]) -> list[dict[str, Any]]:
    """The one write: test the gate list as read, then drop only our gate."""
    rest = [g for g in gates if not (isinstance(g, Mapping) and g.get("name") == GATE)]
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/spec/schedulingGates", "value": list(gates)}]
    if rest:
        ops.append({"op": "replace", "path": "/spec/schedulingGates", "value": rest})
    else:
        ops.append({"op": "remove", "path": "/spec/schedulingGates"})
    return ops


# -- the controller ---------------------------------------------------------------------------------


class PodWriter(Protocol):
    def patch_pod(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> bool:
        """Apply ``ops``; ``False`` when a precondition failed (the gates changed meanwhile)."""

    def event(self, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...


class DeferrerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = self.registry = registry if registry is not None else CollectorRegistry()

        def base(metric: m.Metric) -> str:
            return metric.name.removesuffix("_total")

        self.held = Gauge(m.DEFER_HELD.name, m.DEFER_HELD.help, registry=reg)
        self.released = Counter(
            base(m.DEFER_RELEASED), m.DEFER_RELEASED.help, list(m.DEFER_RELEASED.labels), registry=reg
        )
        self.avoided = Counter(base(m.DEFER_AVOIDED), m.DEFER_AVOIDED.help, registry=reg)
        self.added = Counter(base(m.DEFER_ADDED), m.DEFER_ADDED.help, registry=reg)
        self.missed = Counter(base(m.DEFER_MISSED), m.DEFER_MISSED.help, registry=reg)
        self.errors = Counter(base(m.DEFER_ERRORS), m.DEFER_ERRORS.help, list(m.DEFER_ERRORS.labels), registry=reg)
        self.leader = Gauge(m.DEFER_LEADER.name, m.DEFER_LEADER.help, registry=reg)
        for reason in RELEASE_REASONS:  # every reason exported from the start, at 0
            self.released.labels(reason)
        for reason in ("api", "conflict", "forecast"):
            self.errors.labels(reason)


@dataclass
class Outcome:
    """What one evaluation did with one gated pod."""

    namespace: str
    name: str
    reason: str  # a release reason, or "hold"
    released: bool
    message: str = ""
    decision: Decision | None = None


@dataclass
class _Seen:
    baseline: float  # mean intensity of the run had it started at submission (or first sight)
    first_seen: float


@dataclass
class Deferrer:
    """The release loop's logic: no threads, no network, the clock and the writer injected."""

    writer: PodWriter
    catalogue: SiteCatalogue
    clock: Callable[[], float] = time.time
    step: float = DEFAULT_STEP
    tolerance: float = DEFAULT_TOLERANCE
    interval: float = 30.0
    # the longest wait for the next tick: the interval from the end of this one, the loop's poll
    # (--retry-period) and the tick itself (None: 1.5 intervals + 2 s, the poll's default); a pod
    # whose latest start comes first is released now
    next_tick_within: float | None = None
    watts_per_core: float = DEFAULT_WATTS_PER_CORE
    site_label: str = m.SITE_LABEL
    metrics: DeferrerMetrics = field(default_factory=DeferrerMetrics)
    _seen: dict[str, _Seen] = field(default_factory=dict)
    _released: dict[str, str] = field(default_factory=dict)  # uid -> resourceVersion released from

    def __post_init__(self) -> None:
        if self.next_tick_within is None:
            self.next_tick_within = 1.5 * self.interval + 2.0

    def tick(self, pods: Iterable[Mapping[str, Any]]) -> list[Outcome]:
        """Evaluate every gated pod of ``pods`` (the cache's unscheduled pods) once."""
        now = self.clock()
        outcomes, live, held = [], set(), 0
        for pod in pods:
            if not is_gated(pod):
                continue
            meta = pod.get("metadata") or {}
            uid, rv = str(meta.get("uid", "")), str(meta.get("resourceVersion", ""))
            live.add(uid)
            if self._released.get(uid) == rv:  # our own release, not yet seen back from the watch
                continue
            out = self.evaluate(pod, now)
            outcomes.append(out)
            held += not out.released
        for uid in set(self._seen) - live:
            del self._seen[uid]
        for uid in set(self._released) - live:
            del self._released[uid]
        self.metrics.held.set(held)
        return outcomes

    def evaluate(self, pod: Mapping[str, Any], now: float) -> Outcome:
        meta = pod.get("metadata") or {}
        ns, name, uid = meta.get("namespace", ""), meta.get("name", ""), str(meta.get("uid", ""))
        try:
            terms = deferral_from_pod(pod, created_at(pod))
        except PolicyError as err:
            return self._release(pod, "invalid", f"released: {err}")
        if terms is None:
            return self._release(
                pod,
                "invalid",
                f"released: carries the {GATE} gate but no joulesched.io/deadline or joulesched.io/max-delay-seconds annotation",
            )
        forecast, where = forecast_for(self.catalogue, pod_sites(pod, self.site_label))
        try:
            decision = decide(
                terms, now, forecast, step=self.step, tolerance=self.tolerance, next_decision=now + (self.next_tick_within or 0.0)
            )
        except Exception as err:  # a source that fails in a way of its own: never hold on it
            self.metrics.errors.labels("forecast").inc()
            log.warning("%s/%s: forecast for %s failed (%s); releasing", ns, name, where, err)
            forecast, decision = None, decide(terms, now, None, step=self.step, tolerance=self.tolerance)
        seen = self._seen.get(uid)
        if seen is None:
            seen = self._seen[uid] = _Seen(self._baseline(terms, forecast, decision), now)
        if not decision.release:
            if seen.first_seen == now:
                log.info(
                    "%s/%s: held for %s, planned start %s (%.0f g/kWh now, %.0f at the plan; latest start %s)",
                    ns,
                    name,
                    where,
                    _iso(decision.planned_start),
                    decision.now_mean,
                    decision.planned_mean,
                    _iso(terms.latest_start),
                )
            return Outcome(ns, name, "hold", False, decision=decision)
        message = f"released ({decision.reason}) for {where}"
        if math.isfinite(decision.now_mean):
            message += f": {decision.now_mean:.0f} gCO2e/kWh over the run"
            if math.isfinite(seen.baseline):
                message += f", {seen.baseline:.0f} had it started at submission"
        out = self._release(pod, decision.reason, message, decision)
        if out.released:
            released_mean = decision.now_mean
            if not math.isfinite(released_mean):  # deadline and expired releases carry no means
                released_mean = _run_mean(forecast, now, terms.runtime)
            self._account(pod, terms, seen.baseline, released_mean, where, now)
        return out

    def _baseline(self, terms: Deferral, forecast: CarbonIntensitySource | None, decision: Decision) -> float:
        at_submission = _run_mean(forecast, terms.submitted, terms.runtime)
        return at_submission if math.isfinite(at_submission) else decision.now_mean

    def _account(
        self, pod: Mapping[str, Any], terms: Deferral, baseline: float, released_mean: float, where: str, now: float
    ) -> None:
        # A miss is a release more than one tick past the latest start of a window that had one.
        if terms.latest_start >= terms.submitted and now > terms.latest_start + self.interval:
            self.metrics.missed.inc()
            log.error("%s/%s: released %.0f s after its latest start", *_key(pod), now - terms.latest_start)
        if terms.runtime <= 0 or not (math.isfinite(baseline) and math.isfinite(released_mean)):
            return
        try:
            cores = demand_from_pod(pod).cpu_cores
        except PolicyError:
            return
        site = self.catalogue.sites.get(where)  # one site; several (the lowest of them): PUE 1
        pue = site.pue if site is not None else 1.0
        kwh = cores * self.watts_per_core * pue * terms.runtime / JOULES_PER_KWH
        grams = (baseline - released_mean) * kwh
        if grams >= 0:
            self.metrics.avoided.inc(grams)
        else:
            self.metrics.added.inc(-grams)

    def _release(self, pod: Mapping[str, Any], reason: str, message: str, decision: Decision | None = None) -> Outcome:
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        try:
            ok = self.writer.patch_pod(ns, name, release_patch(gates_of(pod)))
        except Exception as err:  # unreachable, forbidden, gone: the next tick retries from the cache
            self.metrics.errors.labels("api").inc()
            log.warning("%s/%s: release (%s) failed: %s", ns, name, reason, err)
            return Outcome(ns, name, reason, False, f"patch failed: {err}", decision)
        if not ok:
            self.metrics.errors.labels("conflict").inc()
            log.info("%s/%s: gates changed since read; decided again on the next tick", ns, name)
            return Outcome(ns, name, reason, False, "gates changed meanwhile", decision)
        self._released[str(meta.get("uid", ""))] = str(meta.get("resourceVersion", ""))
        self.metrics.released.labels(reason).inc()
        if reason == "invalid":
            log.warning("%s/%s: %s", ns, name, message)
        else:
            log.info("%s/%s: %s", ns, name, message)
        try:
            self.writer.event(
                pod,
                "Warning" if reason == "invalid" else "Normal",
                "InvalidDeferral" if reason == "invalid" else "Released",
                message,
            )
        except Exception as err:  # an Event is a courtesy; the release stands
            self.metrics.errors.labels("api").inc()
            log.warning("%s/%s: could not record the Event: %s", ns, name, err)
        return Outcome(ns, name, reason, True, message, decision)


def _run_mean(forecast: CarbonIntensitySource | None, start: float, runtime: float) -> float:
    """Mean forecast intensity of a run from ``start``, as the decision computes it
    (``policy.deferral.mean_over_runs``); NaN where the forecast cannot say."""
    if forecast is None:
        return math.nan
    return float(mean_over_runs(forecast, np.array([start]), max(runtime, 0.0))[0])


def _key(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if math.isfinite(t) else "?"


# -- leader election --------------------------------------------------------------------------------


class LeaseStore(Protocol):
    def read(self) -> dict[str, Any] | None:
        """The Lease's ``spec`` and ``resourceVersion`` (``{"spec":…, "rv":…}``), or None when absent."""

    def create(self, spec: dict[str, Any]) -> bool: ...

    def replace(self, spec: dict[str, Any], rv: str) -> bool:
        """``False`` on a conflict (someone else wrote it since ``rv``)."""


@dataclass
class LeaderElector:
    """One holder of a coordination.k8s.io Lease, as client-go's leaderelection does it.

    Expiry is judged on this replica's monotonic clock from when it last saw the Lease change,
    never from the holder's ``renewTime`` (clocks of two machines need not agree). A leader
    that has not renewed for ``renew_deadline`` stops acting before a standby may take over at
    ``lease_duration``.
    """

    store: LeaseStore
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    _observed: tuple[Any, ...] | None = None
    _observed_at: float = 0.0
    _renewed_at: float | None = None

    def step(self) -> bool:
        """Try to acquire or renew once; whether this replica leads now."""
        try:
            got = self._try()
        except Exception as err:
            log.warning("lease: %s", err)
            got = False
        now = self.monotonic()
        if got:
            self._renewed_at = now
        elif self._renewed_at is not None and now - self._renewed_at >= self.renew_deadline:
            log.warning("lease: not renewed for %.0f s; standing down", now - self._renewed_at)
            self._renewed_at = None
        return self.leading

    @property
    def leading(self) -> bool:
        return self._renewed_at is not None and self.monotonic() - self._renewed_at < self.renew_deadline

    def _spec(self, current: Mapping[str, Any] | None) -> dict[str, Any]:
        stamp = datetime.fromtimestamp(self.wall(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        mine = current is not None and current.get("holderIdentity") == self.identity
        transitions = int((current or {}).get("leaseTransitions") or 0)
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, math.ceil(self.lease_duration)),
            "acquireTime": (current or {}).get("acquireTime") if mine else stamp,
            "renewTime": stamp,
            "leaseTransitions": transitions if mine or current is None else transitions + 1,
        }

    def _try(self) -> bool:
        lease = self.store.read()
        now = self.monotonic()
        if lease is None:
            return self.store.create(self._spec(None))
        spec = lease["spec"] or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        holder = spec.get("holderIdentity")
        if holder and holder != self.identity:
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            if now - self._observed_at < duration:
                return False
            log.info("lease: %s has not renewed for %.0f s; taking over", holder, now - self._observed_at)
        ok = self.store.replace(self._spec(spec), lease["rv"])
        if ok and holder != self.identity:
            log.info("lease: %s now leads", self.identity)
        return ok

    def release(self) -> None:
        """On a clean stop: clear the holder so a standby need not wait for expiry."""
        if not self.leading:
            return
        try:
            lease = self.store.read()
            if lease and (lease["spec"] or {}).get("holderIdentity") == self.identity:
                spec = dict(lease["spec"])
                spec["holderIdentity"] = ""
                spec["leaseDurationSeconds"] = 1
                self.store.replace(spec, lease["rv"])
        except Exception as err:
            log.warning("lease: could not hand back: %s", err)
        self._renewed_at = None


# -- the Kubernetes side -------------------------------------------------------------------------------


class KubePods:
    """PodWriter over CoreV1Api: the JSON patch, and Events (core/v1)."""

    def __init__(self, api: Any, identity: str) -> None:
        from kubernetes import client

        self._client = client
        self.core: Any = client.CoreV1Api(api)
        self.identity = identity

    def patch_pod(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            # a list body is sent as application/json-patch+json
            self.core.patch_namespaced_pod(
                name, namespace, ops, field_manager=COMPONENT, _request_timeout=30, _preload_content=False
            )
        except ApiException as err:
            # 422: a failed test op (the apiserver's JSON-patch precondition); 409: a conflict; 404: gone
            if err.status in (409, 422):
                return False
            if err.status == 404:
                return False
            raise
        return True

    def event(self, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        meta = pod.get("metadata") or {}
        now = datetime.now(UTC)
        body = {
            "metadata": {"generateName": f"{meta.get('name', 'pod')}.", "namespace": meta.get("namespace")},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.identity,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self.core.create_namespaced_event(meta.get("namespace"), body, _request_timeout=10)


class KubeLease:
    """LeaseStore over CoordinationV1Api."""

    def __init__(self, api: Any, namespace: str, name: str) -> None:
        from kubernetes import client

        self.api: Any = client.CoordinationV1Api(api)
        self.namespace, self.name = namespace, name

    def read(self) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=5, _preload_content=False)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        doc = json.loads(resp.data)
        return {"spec": doc.get("spec") or {}, "rv": doc["metadata"]["resourceVersion"]}

    def _write(self, call: Callable[[], Any]) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            call()
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    def create(self, spec: dict[str, Any]) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }
        return self._write(
            lambda: self.api.create_namespaced_lease(self.namespace, body, _request_timeout=5, _preload_content=False)
        )

    def replace(self, spec: dict[str, Any], rv: str) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace, "resourceVersion": rv},
            "spec": spec,
        }
        return self._write(
            lambda: self.api.replace_namespaced_lease(
                self.name, self.namespace, body, _request_timeout=5, _preload_content=False
            )
        )


class PodCache(ListWatch):
    """The unscheduled pods (``spec.nodeName=``), listed and then watched, in a daemon thread.

    A pod that gets bound leaves the field selector and arrives as DELETED. ``changed`` is set
    whenever a gated pod is added, so a new pod is decided without waiting a whole interval.
    ``error`` names the last failure until a listing succeeds. Lists again, and backs off, as
    every watch of the extender's does (:class:`ListWatch`).
    """

    name = "pod-watch"
    FIELD_SELECTOR = "spec.nodeName="
    MAX_BACKOFF_SECONDS = 30.0

    def __init__(self, api: Any, namespace: str = "") -> None:
        from kubernetes import client

        super().__init__()
        self.core: Any = client.CoreV1Api(api)
        self.namespace = namespace
        self._pods: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.synced = self.listed
        self.changed = threading.Event()

    def pods(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._pods.values())

    def _list_call(self) -> Callable[..., Any]:
        if self.namespace:
            return partial(self.core.list_namespaced_pod, self.namespace)
        return cast(Callable[..., Any], self.core.list_pod_for_all_namespaces)

    def _list(self) -> str:
        resp = self._list_call()(field_selector=self.FIELD_SELECTOR, _preload_content=False, _request_timeout=60)
        doc = json.loads(resp.data)
        pods = {p["metadata"]["uid"]: p for p in doc.get("items") or []}
        version = listing_version(doc)
        with self._lock:
            self._pods = pods
        self.synced.set()  # before ``changed``: a loop it wakes finds the cache synced
        self.changed.set()
        self.error = ""
        return version

    def _watch(self, version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        return watch_events(
            self._list_call(),
            field_selector=self.FIELD_SELECTOR,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_seconds,
        )

    def _handle(self, kind: str, obj: dict[str, Any]) -> None:
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(uid, None)
            else:
                self._pods[uid] = obj
        if kind == "ADDED" and is_gated(obj):
            self.changed.set()


# -- health and metrics over HTTP ---------------------------------------------------------------------


@dataclass
class Health:
    catalogue: SiteCatalogue
    clock: Callable[[], float]
    role: str = "starting"  # leader | standby | starting
    webhook: str = "not configured"
    last_loop: float = field(default_factory=time.monotonic)
    cache_synced: Callable[[], bool] = lambda: True

    def ready(self) -> tuple[bool, dict[str, Any]]:
        now = self.clock()
        sites: dict[str, str] = {}
        for name, site in self.catalogue.sites.items():
            try:
                sites[name] = f"{site.carbon.at(now):.0f} gCO2e/kWh"
            except Exception as err:  # what the source says is what readiness reports
                sites[name] = f"unavailable: {err}"
        readable = any(not v.startswith("unavailable") for v in sites.values())
        synced = self.cache_synced() if self.role == "leader" else True
        ok = readable and synced and self.role in ("leader", "standby")
        return ok, {
            "role": self.role,
            "site_data_readable": readable,
            "pods_synced": synced,
            "webhook": self.webhook,
            "sites": sites,
        }

    def alive(self, stale_after: float) -> bool:
        return time.monotonic() - self.last_loop < stale_after


def serve_http(
    host: str, port: int, health: Health, registry: CollectorRegistry, stale_after: float
) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        server_version = COMPONENT

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                ok = health.alive(stale_after)
                self._send(200 if ok else 503, b"ok\n" if ok else b"control loop stalled\n", "text/plain")
            elif path == "/readyz":
                ok, doc = health.ready()
                self._send(200 if ok else 503, json.dumps(doc).encode() + b"\n", "application/json")
            else:
                self._send(404, b"not found: /metrics, /healthz, /readyz\n", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args)

    httpd = ThreadingHTTPServer((host, port), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    return httpd


# -- the command ------------------------------------------------------------------------------------


def _hostport(text: str, flag: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise DeferrerError(f"{flag} {text!r}: must be HOST:PORT, e.g. 0.0.0.0:8080")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="joulesched deferrer",
        description="Release pods gated by joulesched.io/deferred at the cleanest hour of their window.",
    )
    p.add_argument(
        "--site-file",
        required=True,
        metavar="FILE",
        help="site file with each site's carbon intensity (docs/impact.md)",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG", ""),
        help="kubeconfig file (default: $KUBECONFIG, else the in-cluster service account)",
    )
    p.add_argument("--namespace", default="", help="watch one namespace only (default: all)")
    p.add_argument("--site-label", default=m.SITE_LABEL, help="node label naming a node's site (default: %(default)s)")
    p.add_argument("--interval", type=SECONDS, default=30.0, help="seconds between decisions (default: %(default)s)")
    p.add_argument(
        "--step", type=SECONDS, default=DEFAULT_STEP, help="grid of candidate starts, seconds (default: %(default)s)"
    )
    p.add_argument(
        "--tolerance",
        type=number(at_least=0, below=1),
        default=DEFAULT_TOLERANCE,
        help="release when now is within this fraction of the cleanest start (default: %(default)s)",
    )
    p.add_argument(
        "--watts-per-core",
        type=number(at_least=0),
        default=DEFAULT_WATTS_PER_CORE,
        help="marginal watts per requested core, for the grams-avoided estimate (default: %(default)s)",
    )
    p.add_argument(
        "--listen", default="0.0.0.0:8080", help="HOST:PORT of /metrics, /healthz, /readyz (default: %(default)s)"
    )
    p.add_argument(
        "--no-leader-elect", dest="leader_elect", action="store_false", help="act without the Lease (one replica only)"
    )
    p.add_argument("--lease-name", default=COMPONENT, help="the Lease's name (default: %(default)s)")
    p.add_argument(
        "--lease-namespace",
        default=os.environ.get("POD_NAMESPACE", "joulesched"),
        help="the Lease's namespace (default: $POD_NAMESPACE, else joulesched)",
    )
    p.add_argument("--lease-duration", type=SECONDS, default=15.0, help="seconds (default: %(default)s)")
    p.add_argument("--renew-deadline", type=SECONDS, default=10.0, help="seconds (default: %(default)s)")
    p.add_argument("--retry-period", type=SECONDS, default=2.0, help="seconds (default: %(default)s)")
    p.add_argument(
        "--identity", default="", help="this replica's Lease holder name (default: $POD_NAME, else host_pid)"
    )
    p.add_argument(
        "--webhook-listen",
        default="",
        metavar="HOST:PORT",
        help="also serve the mutating admission webhook (POST /mutate, TLS) here",
    )
    p.add_argument("--tls-cert", default="", help="the webhook's certificate (PEM)")
    p.add_argument("--tls-key", default="", help="the webhook's private key (PEM)")
    p.add_argument(
        "--clock-offset",
        type=number(),
        default=0.0,
        metavar="SECONDS",
        help="decide as if the time were now + SECONDS (rehearsals and tests; Leases keep real time)",
    )
    args = p.parse_args(list(argv))
    if not (args.renew_deadline < args.lease_duration and args.retry_period < args.renew_deadline):
        p.error("need --retry-period < --renew-deadline < --lease-duration")
    if args.webhook_listen and not (args.tls_cert and args.tls_key):
        p.error("--webhook-listen needs --tls-cert and --tls-key (the apiserver calls webhooks over TLS only)")
    return args


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except (DeferrerError, ExtenderError, PolicyError) as err:
        print(f"joulesched deferrer: {err}", file=sys.stderr)
        return 2


def _file_stamp(path: str) -> tuple[int, int] | None:
    """When and how big ``path`` is now (through a ConfigMap's symlinks), None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def read_sites_again(path: str, stamp: tuple[int, int] | None) -> tuple[tuple[int, int] | None, SiteCatalogue | None]:
    """The site file read again when it has changed since ``stamp`` (a ConfigMap edited in place:
    kustomize's name is not hashed): (its stamp now, the new sites); None for the sites when it
    has not changed, or cannot be used (logged once a change; the sites in use stay)."""
    from joulesched.contracts.sitefile import load_site_file

    now = _file_stamp(path)
    if now == stamp:
        return stamp, None
    try:
        changed = load_site_file(path)
        if not changed.sites:
            raise DeferrerError(f"--site-file {path}: no sites")
    except Exception as err:
        log.error("site file changed but cannot be used, keeping the sites in use: %s", err)
        return now, None
    log.info("site file %s read again: %d sites", path, len(changed.sites))
    return now, changed


def run(args: argparse.Namespace) -> int:
    from joulesched.contracts.sitefile import load_site_file
    from joulesched.extender.kube import api_client

    listen = _hostport(args.listen, "--listen")
    webhook_at = _hostport(args.webhook_listen, "--webhook-listen") if args.webhook_listen else None
    if not Path(args.site_file).is_file():
        raise DeferrerError(f"--site-file {args.site_file}: no such file")
    catalogue = load_site_file(args.site_file)
    if not catalogue.sites:
        raise DeferrerError(f"--site-file {args.site_file}: no sites")
    site_stamp = _file_stamp(args.site_file)
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        raise DeferrerError(f"--kubeconfig {args.kubeconfig}: no such file")
    try:
        api = api_client(args.kubeconfig)
    except Exception as err:  # the config loaders raise several types
        raise DeferrerError(f"kubernetes client config ({args.kubeconfig or 'in-cluster'}): {err}") from err
    identity = args.identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"

    offset = float(args.clock_offset)

    def clock() -> float:
        return time.time() + offset

    metrics = DeferrerMetrics()
    deferrer = Deferrer(
        KubePods(api, identity),
        catalogue,
        clock=clock,
        step=args.step,
        tolerance=args.tolerance,
        interval=args.interval,
        next_tick_within=1.5 * args.interval + args.retry_period,
        watts_per_core=args.watts_per_core,
        site_label=args.site_label,
        metrics=metrics,
    )
    cache = PodCache(api, args.namespace)
    health = Health(catalogue, clock, cache_synced=cache.synced.is_set)
    elector = (
        LeaderElector(
            KubeLease(api, args.lease_namespace, args.lease_name), identity, args.lease_duration, args.renew_deadline
        )
        if args.leader_elect
        else None
    )
    webhook: Any = None

    def serve_webhook() -> Any:
        """The webhook, once its certificate is there (the Secret may come after the pod: it is
        optional in deploy/, and the controller runs meanwhile with the webhook off, which
        /readyz says); then the certificate is loaded again whenever it is renewed."""
        from joulesched.extender.admission import WebhookServer

        if webhook is not None:
            webhook.reload_if_changed()
            return webhook
        missing = [f for f in (args.tls_cert, args.tls_key) if not os.path.isfile(f)]
        if missing:
            off = f"off: no certificate at {', '.join(missing)}"
            if health.webhook != off:
                log.warning("webhook not served yet: %s (docs/deferral.md: the webhook's certificate)", ", ".join(missing))
            health.webhook = off
            return None
        assert webhook_at is not None
        started = WebhookServer(*webhook_at, args.tls_cert, args.tls_key, args.namespace)
        started.start()
        health.webhook = f"serving on {args.webhook_listen}"
        log.info("webhook serving on %s", args.webhook_listen)
        return started

    if webhook_at:
        webhook = serve_webhook()
    httpd = serve_http(*listen, health, metrics.registry, stale_after=3 * max(args.interval, args.retry_period) + 30)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info(
        "deferrer %s: %d sites from %s, interval %.0f s%s%s",
        identity,
        len(catalogue.sites),
        args.site_file,
        args.interval,
        f", clock offset {args.clock_offset:+.0f} s" if args.clock_offset else "",
        f", webhook on {args.webhook_listen}" if webhook else "",
    )
    cache_started, next_tick = False, 0.0
    while not stop.is_set():
        site_stamp, changed = read_sites_again(args.site_file, site_stamp)
        if changed is not None:
            deferrer.catalogue = health.catalogue = changed
        if webhook_at:
            try:
                webhook = serve_webhook()
            except Exception as err:  # a certificate that cannot be loaded: said once, tried again
                if health.webhook != f"off: {err}":
                    log.error("webhook not served: %s", err)
                health.webhook = f"off: {err}"
        leading = elector.step() if elector else True
        metrics.leader.set(1 if leading else 0)
        health.role = "leader" if leading else "standby"
        health.last_loop = time.monotonic()
        if leading and not cache_started:
            cache.start()  # the standby neither lists nor watches: it holds no state to lose
            cache_started = True
        if leading and cache.synced.is_set() and (time.monotonic() >= next_tick or cache.changed.is_set()):
            cache.changed.clear()
            deferrer.tick(cache.pods())
            next_tick = time.monotonic() + args.interval
        if not leading and cache_started:
            metrics.held.set(0)
        stop.wait(args.retry_period if elector else min(args.interval, 1.0))
    log.info("deferrer %s: stopping", identity)
    cache.stop()
    if elector:
        elector.release()
    httpd.shutdown()
    if webhook:
        webhook.stop()
    return 0
