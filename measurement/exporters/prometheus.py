"""Prometheus exposition of the latest published snapshot, through a custom collector.

The collector builds every family from one snapshot at scrape time, so a scrape never sees half
an update. Names, types, help and label names come from :mod:`measurement.names`; the exporter
adds no name of its own. The agent publishes a snapshot for scraping at most once per second,
whatever the sampling interval (the PLATYPUS side channel needs finer resolution than that).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from joulesched.contracts import names as n
from joulesched.contracts.carbon_apis import live_source
from joulesched.measurement.snapshot import ANOMALY_KINDS, READ_SECONDS_BUCKETS, UNESTIMATED_KINDS, Snapshot
from joulesched.policy.site import IntensityUnavailable, NoIntensity, SiteCatalogue

log = logging.getLogger(__name__)

ERROR_LABEL_CHARS = 300  # a source's error label: long enough to name the cause and the fix


def _family(metric: n.Metric) -> Metric:
    labels = list(metric.labels)
    if metric.type == "counter":
        return CounterMetricFamily(metric.name, metric.help, labels=labels)
    if metric.type == "gauge":
        return GaugeMetricFamily(metric.name, metric.help, labels=labels)
    if metric.type == "histogram":
        return HistogramMetricFamily(metric.name, metric.help, labels=labels)
    raise ValueError(f"metric {metric.name}: unsupported type {metric.type!r}")


class _Families:
    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}

    def add(self, metric: n.Metric, labels: Sequence[str], value: float) -> None:
        if len(labels) != len(metric.labels):
            raise ValueError(f"{metric.name}: {len(labels)} label values for labels {metric.labels}")
        family = self.families.get(metric.name)
        if family is None:
            family = self.families[metric.name] = _family(metric)
        family.add_metric(list(labels), value)  # type: ignore[attr-defined]

    def histogram(self, metric: n.Metric, labels: Sequence[str], cumulative: Sequence[int], total: float) -> None:
        family = self.families.get(metric.name)
        if family is None:
            family = self.families[metric.name] = _family(metric)
        bounds = [*(f"{b:g}" for b in READ_SECONDS_BUCKETS), "+Inf"]
        family.add_metric(list(labels), buckets=list(zip(bounds, cumulative, strict=True)), sum_value=total)  # type: ignore[attr-defined]


def server_key(server_id: str, node: str) -> str:
    """The physical server a node's ``server_id`` label names: its configured ``node.server_id``,
    else its node name (the site file's ``servers`` are keyed by either). The same in
    ``joulesched_node_info`` and the server gauges, so that the recording rules join each node to
    its own server, and no two nodes without a server id to each other's."""
    return server_id or node


def families(snap: Snapshot) -> list[Metric]:
    """Every metric family of one snapshot, in the order of :data:`measurement.names.METRICS`."""
    f = _Families()
    node = snap.node
    for z in snap.zones:
        f.add(n.NODE_ENERGY, (node, z.source, z.zone), z.joules_total)
        f.add(n.NODE_ENERGY_ESTIMATED, (node, z.source, z.zone), z.estimated_joules_total)
        if z.watts is not None and z.present:
            f.add(n.NODE_POWER, (node, z.source, z.zone), z.watts)
    for basis, joules in sorted(snap.node_energy_total.items()):
        f.add(n.NODE_PLATFORM_ENERGY, (node, basis), joules)
    if snap.node_power_watts is not None:
        f.add(n.NODE_PLATFORM_POWER, (node, snap.basis), snap.node_power_watts)
    # Only the domains this node's sources can fill: no series of zeros for GPUs a node lacks.
    present = snap.domains
    if snap.basis:
        for domain in present:
            f.add(n.NODE_DOMAIN_ENERGY, (node, domain), snap.domain_energy_total.get(domain, 0.0))
    policy = snap.idle_policy
    for pod in snap.pods:
        energy = pod.energy_joules_total
        for domain in present:
            f.add(n.POD_ENERGY, (node, pod.namespace, pod.name, domain, policy), energy.get(domain, 0.0))
        f.add(n.POD_CPU_SECONDS, (node, pod.namespace, pod.name), pod.cpu_seconds_total)
    for bucket, domains in sorted(snap.buckets_total.items()):
        for domain in present:
            f.add(n.IDLE_ENERGY, (node, domain, policy, bucket), domains.get(domain, 0.0))
    f.add(n.NODE_CPU_SECONDS, (node,), snap.busy_cpu_seconds_total)
    for namespace, kind, owner, cores in snap.owners:
        f.add(n.OWNER_CPU_CORES, (namespace, kind, owner), cores)
    f.add(n.NODE_CPU_CORES, (node,), float(snap.cpus))
    if snap.utilisation_measured:  # none before the first interval: absent, never an idle node
        f.add(n.NODE_CPU_UTILISATION, (node,), snap.utilisation)
    for m in snap.models:
        f.add(n.MODEL_IDLE, (node, m.device), m.idle_watts)
        f.add(n.MODEL_PER_CORE, (node, m.device), m.slope_watts)
        f.add(n.MODEL_R2, (node, m.device), m.r2)
        f.add(n.MODEL_SAMPLES, (node, m.device), float(m.samples))
    f.add(n.NODE_SPEED, (node,), snap.speed)
    if snap.power_cap_watts is not None:
        f.add(n.NODE_POWER_CAP, (node,), snap.power_cap_watts)
    if snap.gpus is not None:
        f.add(n.NODE_GPU_COUNT, (node,), float(snap.gpus.count))
        f.add(n.NODE_GPU_IDLE, (node,), snap.gpus.idle_watts)
        f.add(n.NODE_GPU_MAX, (node,), snap.gpus.max_watts)
        if snap.gpus.utilisation_measured:  # a failed utilisation query: absent, never idle GPUs
            f.add(n.NODE_GPU_UTILISATION, (node,), snap.gpus.utilisation)
    f.add(n.NODE_INFO, (node, snap.site, server_key(snap.server_id, node)), 1.0)
    for s in snap.sources:
        f.add(n.SOURCE_UP, (s.name,), 1.0 if s.up else 0.0)
        if s.error:
            f.add(n.SOURCE_ERROR, (s.name, s.error[:ERROR_LABEL_CHARS]), 1.0)
        f.histogram(n.SOURCE_READ_SECONDS, (s.name,), s.read_seconds_buckets, s.read_seconds_sum)
        f.add(n.SOURCE_ERRORS, (s.name,), float(s.errors_total))
    # every kind a zone can count, from the zone's first snapshot: a counter created by its
    # first event would hide that event from increase()
    kinds = [(z.source, z.zone, kind) for z in snap.zones for kind in ANOMALY_KINDS.get(z.kind, ())]
    counted = {(s, z, k): float(c) for s, z, k, c in snap.anomalies}
    for key in sorted(counted.keys() | set(kinds)):
        f.add(n.ANOMALIES, key, counted.get(key, 0.0))
    counted = {(s, z, k): sec for s, z, k, sec in snap.discarded}
    for key in sorted(counted.keys() | set(kinds)):
        f.add(n.DISCARDED_SECONDS, key, counted.get(key, 0.0))
    counted = {(s, z, k): sec for s, z, k, sec in snap.estimated}
    for key in sorted(counted.keys() | {k for k in kinds if k[2] not in UNESTIMATED_KINDS}):
        f.add(n.ESTIMATED_SECONDS, key, counted.get(key, 0.0))
    for pair, ratio in sorted(snap.ratios.items()):
        f.add(n.SOURCE_RATIO, (node, pair), ratio)
    f.add(n.WINDOWS_OPEN, (node,), float(snap.windows_open))
    f.add(n.CLOCK_STEP, (node,), snap.clock_step)
    order = {m.name: i for i, m in enumerate(n.METRICS)}
    return [f.families[name] for name in sorted(f.families, key=lambda k: order.get(k, len(order)))]


class SnapshotCollector(Collector):
    """Reads the snapshot returned by ``latest`` at each scrape."""

    def __init__(self, latest: Callable[[], Snapshot | None]) -> None:
        self.latest = latest

    def describe(self) -> list[Metric]:
        return []  # the families depend on the hardware found; no collision check needed

    def collect(self) -> Iterator[Metric]:
        snap = self.latest()
        if snap is not None:
            yield from families(snap)


@dataclass(frozen=True)
class SiteFactors:
    """The site and server factors of this node, from the site file (``sites.file``).

    Exported beside the node's ``joulesched_node_info{site, server_id}`` so that the recording
    rules (deploy/prometheus) and ``joulesched report`` can join them: every agent of a site
    exports the same values, and the rules take ``max by (site)``.
    """

    catalogue: SiteCatalogue
    site: str
    server_id: str
    node: str
    clock: Callable[[], float] = time.time

    def families(self) -> list[Metric]:
        f = _Families()
        site = self.catalogue.sites.get(self.site)
        if site is not None:
            f.add(n.SITE_PUE, (site.name,), site.pue)
            try:  # a series that cannot answer now leaves the gauge out: no invented intensity
                f.add(n.SITE_CARBON, (site.name,), site.carbon.at(self.clock()))
            except IntensityUnavailable as err:
                if not isinstance(site.carbon, NoIntensity):  # none given: said once, at start
                    log.warning("site %s: carbon intensity unavailable: %s", site.name, err)
            live = live_source(site.carbon)
            if live is not None:  # how old the live value is: stale data must show as such
                f.add(n.SITE_CARBON_AGE, (site.name,), live.age())
            f.add(n.SITE_WUE, (site.name,), site.wue)
            f.add(n.SITE_RENEWABLE, (site.name,), site.renewable_share)
        key = server_key(self.server_id, self.node)
        server = self.catalogue.embodied(key)
        if server is not None:
            f.add(n.SERVER_EMBODIED, (key,), server.embodied_kg * 1000.0)
            f.add(n.SERVER_LIFETIME, (key,), server.lifetime_seconds)
        return list(f.families.values())


class SiteCollector(Collector):
    def __init__(self, factors: SiteFactors) -> None:
        self.factors = factors

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self.factors.families()


def make_registry(latest: Callable[[], Snapshot | None], site: SiteFactors | None = None) -> CollectorRegistry:
    """A fresh registry holding only the agent's collectors (no process/platform collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(latest))
    if site is not None:
        registry.register(SiteCollector(site))
    return registry


__all__ = ["SiteCollector", "SiteFactors", "SnapshotCollector", "families", "make_registry", "server_key"]
