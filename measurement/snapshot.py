"""The frozen snapshot the sampler produces once per interval; exporters read nothing else.

Totals (``*_total``) count from the agent's start; ``interval`` holds what happened between the
previous snapshot and this one (the part the simulator and the conservation test look at).
Mappings inside a snapshot are never mutated after it is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

# up to the slowest sources' timeouts (Redfish 10 s, IPMI 15 s) and beyond: a read that hangs
# until its timeout must fall in a bucket of its own, not only in +Inf
READ_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0)

# The anomaly kinds a zone of each kind can count (policy.energy.counter_delta, trapezoid and the
# meter's re-listing): the agent exports each at 0 from the zone's first snapshot, so that
# increase() over the anomaly counters sees the first one too. A garbage reading loses no time:
# it is never estimated.
ANOMALY_KINDS: dict[str, tuple[str, ...]] = {
    "counter": ("garbage", "negative", "implausible", "reset", "gap"),
    "power": ("garbage", "negative", "gap"),
}
UNESTIMATED_KINDS = frozenset({"garbage"})


@dataclass(frozen=True, slots=True)
class ZoneSnapshot:
    source: str
    zone: str
    domain: str
    kind: str  # counter | power
    parent: str | None
    max_joules: float | None
    joules_total: float  # wrap-corrected energy since the agent started
    watts: float | None  # over sources.power_window_seconds; None before two readings and during a gap
    present: bool  # False once the zone has been unplugged (its counter stays)
    estimated_joules_total: float = 0.0  # estimated for intervals it could not measure (not in joules_total)


@dataclass(frozen=True, slots=True)
class SourceSnapshot:
    name: str
    up: bool
    error: str
    read_seconds_buckets: tuple[int, ...]  # cumulative counts per READ_SECONDS_BUCKETS, then +Inf
    read_seconds_sum: float
    read_count: int
    errors_total: int


class PodSnapshot(NamedTuple):  # a tuple: hundreds are built per interval, so it must be cheap
    uid: str
    namespace: str  # "" when the API is not reachable
    name: str  # the UID when the API is not reachable
    qos: str
    owner_kind: str
    owner: str
    requests_millicores: float | None
    cpu_seconds_total: float  # CPU time seen by the agent (not before its first sight)
    energy_joules_total: Mapping[str, float]  # domain -> joules
    present: bool  # False after the pod's cgroup vanished (kept for pod_retention_seconds)


@dataclass(frozen=True, slots=True)
class ModelSnapshot:
    device: str  # cpu | gpu-N
    idle_watts: float
    slope_watts: float  # per busy core (cpu) or per fully busy GPU
    r2: float
    samples: int


@dataclass(frozen=True, slots=True)
class GpuSummary:
    count: int
    idle_watts: float  # mean per GPU
    max_watts: float  # mean per GPU: power limit when known, else idle + slope
    utilisation: float  # mean of the GPUs, 0..1 (0.0 where not measured)
    # False while a GPU's utilisation is unknown (its query failed, or no source reports it):
    # the gauge is left out then; utilisation holds 0.0 for the readers that need a number
    utilisation_measured: bool = True


@dataclass(frozen=True, slots=True)
class Interval:
    start: float
    end: float
    seconds: float
    basis: str
    node_joules: float
    domains: Mapping[str, float]  # cpu, dram, gpu, other
    pods: Mapping[str, Mapping[str, float]]  # uid -> domain -> joules
    buckets: Mapping[str, Mapping[str, float]]  # idle|system -> domain -> joules
    busy_cpu_seconds: float
    pod_cpu_seconds: Mapping[str, float]
    zones: Mapping[str, float]  # "source/zone" -> joules, measured + estimated (dropped unestimated: 0)
    estimated_joules: float = 0.0  # the estimated part of node_joules


@dataclass(frozen=True)
class Snapshot:
    node: str
    seq: int
    time: float  # the sampler's clock at the read (measurement/clock.py: it never steps)
    interval_seconds: float  # configured sampling interval
    idle_policy: str
    cpus: int
    utilisation: float  # 0..1 over the last interval (0.0 where not measured)
    basis: str
    sources_used: tuple[str, ...]
    zones: tuple[ZoneSnapshot, ...]
    sources: tuple[SourceSnapshot, ...]
    node_energy_total: Mapping[str, float]  # basis -> joules accumulated while it was the basis
    node_power_watts: float | None
    domain_energy_total: Mapping[str, float]
    buckets_total: Mapping[str, Mapping[str, float]]
    busy_cpu_seconds_total: float
    pods: tuple[PodSnapshot, ...]
    models: tuple[ModelSnapshot, ...]
    anomalies: tuple[tuple[str, str, str, int], ...]  # (source, zone, kind, count)
    ratios: Mapping[str, float]  # "a/b" -> ratio of energies over the cross-check window
    gpus: GpuSummary | None
    owners: tuple[tuple[str, str, str, float], ...]  # (namespace, kind, owner, mean cores per pod)
    windows_open: int
    interval: Interval | None = None
    server_id: str = ""
    site: str = ""
    speed: float = 1.0
    power_cap_watts: float | None = None
    domains: tuple[str, ...] = ("cpu", "dram", "gpu", "other")  # those this node's sources can produce
    discarded: tuple[tuple[str, str, str, float], ...] = ()  # (source, zone, kind, seconds not counted)
    estimated: tuple[tuple[str, str, str, float], ...] = ()  # (source, zone, kind, seconds estimated)
    clock_step: float = 0.0  # how far the system clock had been stepped since the agent started
    # False before the first interval and for one the clock did not advance across: no CPU
    # utilisation measured (the gauge is left out; utilisation holds 0.0)
    utilisation_measured: bool = True

    @property
    def wall_time(self) -> float:
        """``time`` as the system clock gives it now: what is exported as a time of day."""
        return self.time + self.clock_step

    def model(self, device: str) -> ModelSnapshot | None:
        return next((m for m in self.models if m.device == device), None)


__all__ = [
    "ANOMALY_KINDS",
    "READ_SECONDS_BUCKETS",
    "UNESTIMATED_KINDS",
    "GpuSummary",
    "Interval",
    "ModelSnapshot",
    "PodSnapshot",
    "Snapshot",
    "SourceSnapshot",
    "ZoneSnapshot",
]
