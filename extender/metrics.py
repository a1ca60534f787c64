"""The extender's own metrics (names from ``contracts.names``).

Under gunicorn each worker is a process: prometheus-client's multiprocess mode (the
``PROMETHEUS_MULTIPROC_DIR`` environment variable, set and cleaned by ``joulesched extender``
before the workers start, plus the ``child_exit`` hook in ``extender/gunicorn_conf.py``) lets
``/metrics`` of any worker report all of them. Without the variable (tests, a single
process) the metrics live in the registry passed in.

Per-node gauges (last score, marginal watts) are written by a background thread once a
second from the last decision, only for nodes that have a profile (a request naming a million
unknown nodes creates no series), never on the request path: for 5,000 nodes that is thousands
of label look-ups that a scheduling request should not wait for.
"""

from __future__ import annotations

import glob
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as mp

from joulesched.contracts import names as m
from joulesched.contracts.runtime import BuildInfoCollector

if TYPE_CHECKING:  # service imports the profile sources and the policy; the writer needs only the type
    from joulesched.extender.service import Decision

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# The label values the counters below can take, each exported at 0 from a worker's start: a
# series created by its first event would hide that event from increase() (and from any alert
# on it). The verb endpoint, the routes and the HTTP worker (extender/app.py, worker.py) give
# the failures; a combination not listed here is still counted, from its first event.
VERBS = ("filter", "prioritize", "preempt", "bind", "explain")  # the extender's verbs (its routes, extender/app.py)
KNOWN_FAILURES: tuple[tuple[str, str], ...] = (
    *((verb, reason) for verb in VERBS for reason in ("bad_request", "too_large", "internal", "client_gone", "method")),
    ("bind", "bind_disabled"),
    ("unknown", "unknown_verb"),
    ("unknown", "method"),
    ("unknown", "client_gone"),
    ("other", "unknown_path"),
    ("other", "method"),
    ("other", "internal"),
    *(
        ("http", reason)
        for reason in (
            "read_timeout",
            "head_too_large",
            "length_required",
            "bad_request_line",
            "no_client_certificate",
            "busy",
            "malformed",
            "internal",
        )
    ),
)
NEUTRAL_REASONS = ("unknown", "stale", "invalid")
FILTER_REASONS = ("power_cap",)
BIND_WAIT_OUTCOMES = ("bound", "deadline")
# Per-node gauges: a worker sets a node's to NaN when it evicts the node (a series cannot be
# deleted from its multiprocess file); the collector leaves NaN out, so the series goes stale.
NODE_GAUGES = frozenset({m.EXT_NODE_SCORE.name, m.EXT_MARGINAL_WATTS.name})


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.multiprocess = multiprocess_dir() is not None
        # In multiprocess mode values go to files, not to a registry.
        reg = None if self.multiprocess else (registry if registry is not None else CollectorRegistry())
        self.registry = reg
        # A constant, computed per scrape, never written to the multiprocess files.
        self.build_info = BuildInfoCollector()
        if reg is not None:
            reg.register(self.build_info)

        def labels(metric: m.Metric) -> list[str]:
            return list(metric.labels)

        self.requests = Counter(_base(m.EXT_REQUESTS), m.EXT_REQUESTS.help, labels(m.EXT_REQUESTS), registry=reg)
        self.latency = Histogram(
            m.EXT_LATENCY.name, m.EXT_LATENCY.help, labels(m.EXT_LATENCY), buckets=LATENCY_BUCKETS, registry=reg
        )
        self.failures = Counter(_base(m.EXT_FAILURES), m.EXT_FAILURES.help, labels(m.EXT_FAILURES), registry=reg)
        self.neutral = Counter(_base(m.EXT_NEUTRAL), m.EXT_NEUTRAL.help, labels(m.EXT_NEUTRAL), registry=reg)
        self.filtered = Counter(_base(m.EXT_FILTERED), m.EXT_FILTERED.help, labels(m.EXT_FILTERED), registry=reg)
        self.filter_kept = Counter(_base(m.EXT_FILTER_KEPT), m.EXT_FILTER_KEPT.help, labels(m.EXT_FILTER_KEPT), registry=reg)
        self.source_errors = Counter(
            _base(m.EXT_SOURCE_ERRORS), m.EXT_SOURCE_ERRORS.help, labels(m.EXT_SOURCE_ERRORS), registry=reg
        )
        self.node_score = Gauge(
            m.EXT_NODE_SCORE.name, m.EXT_NODE_SCORE.help, labels(m.EXT_NODE_SCORE), registry=reg, multiprocess_mode="mostrecent"
        )
        self.marginal_watts = Gauge(
            m.EXT_MARGINAL_WATTS.name,
            m.EXT_MARGINAL_WATTS.help,
            labels(m.EXT_MARGINAL_WATTS),
            registry=reg,
            multiprocess_mode="mostrecent",
        )
        self.data_age = Gauge(m.EXT_DATA_AGE.name, m.EXT_DATA_AGE.help, registry=reg, multiprocess_mode="mostrecent")
        self.profiles = Gauge(
            m.EXT_PROFILES.name, m.EXT_PROFILES.help, list(m.EXT_PROFILES.labels), registry=reg, multiprocess_mode="mostrecent"
        )
        self.bind_waits = Counter(_base(m.EXT_BIND_WAITS), m.EXT_BIND_WAITS.help, labels(m.EXT_BIND_WAITS), registry=reg)
        self.bind_wait_seconds = Counter(
            _base(m.EXT_BIND_WAIT_SECONDS), m.EXT_BIND_WAIT_SECONDS.help, labels(m.EXT_BIND_WAIT_SECONDS), registry=reg
        )
        self.connections = Counter(_base(m.EXT_CONNECTIONS), m.EXT_CONNECTIONS.help, registry=reg)
        self.binds_in_flight = Gauge(
            m.EXT_BINDS_IN_FLIGHT.name, m.EXT_BINDS_IN_FLIGHT.help, registry=reg, multiprocess_mode="livesum"
        )
        # Every worker's ledger holds the same placements (each worker's pod watch sees every
        # binding), so the workers' values are not summed. The most recent, not the largest:
        # a worker writes it only when it answers a decision, and an idle worker's value from
        # a burst long gone would otherwise stand above the others' for as long as it idles.
        self.predicted_pods = Gauge(
            m.EXT_PREDICTED_PODS.name, m.EXT_PREDICTED_PODS.help, registry=reg, multiprocess_mode="mostrecent"
        )
        # At 0 from the start (in multiprocess mode: in this worker's file; the collector sums
        # the workers' counters per label set, so every worker writing its 0 duplicates nothing).
        for verb, reason in KNOWN_FAILURES:
            self.failures.labels(verb, reason)
        for reason in NEUTRAL_REASONS:
            self.neutral.labels(reason)
        for reason in FILTER_REASONS:
            self.filtered.labels(reason)
        for outcome in BIND_WAIT_OUTCOMES:
            self.bind_waits.labels(outcome)
            self.bind_wait_seconds.labels(outcome)

    def exposition(self) -> bytes:
        if self.multiprocess:
            registry = CollectorRegistry()
            WorkerFilesCollector(registry)
            registry.register(self.build_info)
            return generate_latest(registry)
        assert self.registry is not None
        return generate_latest(self.registry)


class WorkerFilesCollector(mp.MultiProcessCollector):
    """prometheus-client's multiprocess collector, less the files a worker has only begun.

    A worker creates each of its files empty and sizes it a moment later (``MmapedDict``);
    prometheus-client reads an empty file as a corrupt header and fails the whole scrape
    with ``struct.error`` (prometheus/client_python#1199), so a scrape while a worker boots
    answered 500. An empty file holds no values yet, so leaving it out loses nothing; any
    other unreadable file still fails the scrape. A file removed between the listing and
    its size (a dead worker's live gauges) is left to prometheus-client, which skips those.

    The per-node gauges' NaN samples (a node a worker evicted, :meth:`NodeGaugeWriter.evict`)
    are left out before the workers' values are merged: a node every worker evicted has no
    sample, and its series goes stale in Prometheus; one another worker still scores keeps
    that worker's value (a NaN written later must not hide it).
    """

    def collect(self) -> Any:
        files = []
        for path in glob.glob(os.path.join(self._path, "*.db")):
            try:
                if os.path.getsize(path) == 0:
                    continue
            except FileNotFoundError:
                pass
            files.append(path)
        metrics = self._read_metrics(files)
        for name in NODE_GAUGES:
            metric = metrics.get(name)
            if metric is not None:
                metric.samples = [s for s in metric.samples if not math.isnan(s.value)]
        return self._accumulate_metrics(metrics, True)


@dataclass(frozen=True)
class ProfileStatus:
    """What /readyz and the gauges say of the profile source."""

    age_seconds: float  # since the source last answered
    fresh: int
    stale: int  # measured longer ago than max_age_seconds


def _base(metric: m.Metric) -> str:
    """prometheus-client appends ``_total`` to counters itself."""
    return metric.name.removesuffix("_total")


class NodeGaugeWriter:
    """Copies the last decision into the per-node gauges, off the request path.

    Only values that changed are written, through labelled children looked up once per node:
    under gunicorn each ``labels()`` and ``set()`` touches the multiprocess files, and doing
    that for every node of a 5,000-node cluster every second would hold the worker's GIL for
    tens of milliseconds and stall the requests that share it.
    """

    NEW_PER_TICK = 256  # new nodes' series created per tick (about 35 µs each, in the multiprocess files)
    EVICT_AFTER_SECONDS = 3600.0

    def __init__(
        self,
        metrics: ExtenderMetrics,
        last: Callable[[], Decision | None],
        interval: float = 1.0,
        status: Callable[[], ProfileStatus | None] | None = None,
    ) -> None:
        self.metrics = metrics
        self.last = last
        self.status = status
        self.interval = interval
        self._seen: object = None
        self._written: dict[str, list[Any]] = {}  # node -> [score child, watts child, score, watts, last seen]
        self._swept = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-gauges", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.write_once()

    def write_once(self) -> None:
        if self.status is not None:  # every tick, requests or not: a stalled source shows
            status = self.status()
            if status is not None:
                self.metrics.data_age.set(status.age_seconds)
                self.metrics.profiles.labels("fresh").set(status.fresh)
                self.metrics.profiles.labels("stale").set(status.stale)
        decision = self.last()
        if decision is None or decision is self._seen:
            return
        self._seen = decision
        ev = decision.evaluation
        names = decision.args.node_names
        snap = decision.snapshot
        scores = ev.scores.tolist()
        marginal = ev.marginal_watts.tolist()
        known = decision.rows.tolist()
        written = self._written
        at = decision.at
        budget = self.NEW_PER_TICK
        for name, score, watts, row in zip(names, scores, marginal, known, strict=True):
            if row < 0:  # no profile: a name only the request knows makes no series (bounded cardinality)
                continue
            entry = written.get(name)
            if entry is None:
                if budget == 0:  # the rest come with the next ticks: never a long GIL hold
                    self._seen = None
                    continue
                budget -= 1
                if budget % 16 == 0:
                    time.sleep(0)  # let a request thread have the GIL between small batches
                entry = written[name] = [
                    self.metrics.node_score.labels(name),
                    self.metrics.marginal_watts.labels(name),
                    None,
                    None,
                    at,
                ]
            entry[4] = at
            if entry[2] != score:
                entry[0].set(score)
                entry[2] = score
            if watts == watts and abs(watts) != float("inf") and entry[3] != watts:  # finite
                entry[1].set(watts)
                entry[3] = watts
        if snap.ready and self.status is None:
            self.metrics.data_age.set(max(0.0, decision.at - snap.loaded_at))
        if at - self._swept >= 60.0:
            self._swept = at
            self.evict(at - self.EVICT_AFTER_SECONDS)

    def evict(self, before: float) -> None:
        """Drop the series of nodes in no decision since ``before`` (removed, renamed, replaced).

        In multiprocess mode a series cannot be deleted from the worker's file: it is set to NaN,
        which :class:`WorkerFilesCollector` leaves out (no sample: the series goes stale, as a
        removed one does), and its entry there is reused if the node comes back.
        """
        for name in [n for n, entry in self._written.items() if entry[4] < before]:
            entry = self._written.pop(name)
            for metric, child in ((self.metrics.node_score, entry[0]), (self.metrics.marginal_watts, entry[1])):
                child.set(math.nan)
                if not self.metrics.multiprocess:
                    metric.remove(name)
