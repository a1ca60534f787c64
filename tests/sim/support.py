"""Small clusters and workloads for the simulator's tests."""

from __future__ import annotations

from typing import Any

from joulesched.sim.cluster import ClusterSpec, parse_cluster
from joulesched.sim.model import PodSpec, Trace, Workload

LINEAR = [100.0 + 10.0 * i for i in range(11)]  # 100 W idle, +10 W per 10 % (10 cores: 10 W per busy core)


def node_type(name: str, count: int = 1, *, site: str = "a", cores: float = 10, curve: list[float] | None = None, **kw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": name, "count": count, "site": site, "cores": cores, "memory": "64Gi", "power_curve_watts": curve or LINEAR}
    doc.update(kw)
    return doc


def cluster(*types: dict[str, Any], sites: dict[str, Any] | None = None, autoscaler: dict[str, Any] | None = None) -> ClusterSpec:
    doc: dict[str, Any] = {"start": "2022-06-01T00:00:00Z", "sites": sites or {"a": {"pue": 1.0, "carbon_intensity": 0.0}}, "node_types": list(types)}
    if autoscaler is not None:
        doc["autoscaler"] = autoscaler
    return parse_cluster(doc, "test-cluster.yaml")


def pod(name: str, duration: float, cpu: float = 1.0, usage: float | None = None, arrival: float = 0.0, **kw: Any) -> PodSpec:
    return PodSpec(name=name, duration=duration, cpu_request=cpu, cpu_usage=cpu if usage is None else usage, arrival=arrival, **kw)


def workload(*pods: PodSpec) -> Workload:
    return Workload.of([Trace("t", "test", "synthetic", tuple(pods))])
