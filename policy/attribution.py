"""Attribution of one interval's node energy to pods, so that the parts add up to the whole.

For the non-GPU domains (``cpu``, ``dram``, ``other``), with E their energy over the interval::

    idle     = min(E, P_idle × dt)           P_idle: the power model's fitted idle watts
    dynamic  = E − idle
    pod p    = dynamic × cpu_p / cpu_node  +  idle × r_p / Σ r     (idle_policy: requests)
             = dynamic × cpu_p / cpu_node                          (idle_policy: bucket)
    system   = dynamic × (cpu_node − Σ cpu_p) / cpu_node           (kernel, kubelet, daemons)
    idle bucket = idle                      (bucket; also under requests when no pod requests)

cpu_p is the pod's cgroup CPU time in the interval, cpu_node the node's busy CPU time
(/proc/stat); when cgroup and /proc/stat reads disagree by a few ticks and Σ cpu_p > cpu_node,
Σ cpu_p is used, so no pod gets more than the dynamic energy. r_p is the pod's CPU request.
A pod's share of E is split over ``cpu``, ``dram`` and ``other`` in proportion to them.

For each GPU g with energy E_g: idle_g = min(E_g, P_idle,g × dt); the dynamic part goes to pods by
their processes' SM utilisation of g (Σ over the pod's pids), the part of non-pod processes and of
an unused GPU to ``system``; idle_g goes to the pods using g in proportion to their use (policy
``requests``) or to the idle bucket (policy ``bucket``, or no pod on it).

Conservation: for every domain, Σ pods + idle bucket + system bucket = the node's energy; the
system bucket is computed as the remainder, so rounding cannot leak energy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from joulesched.policy.energy import NodeSplit

IDLE_POLICIES = ("requests", "bucket")
BUCKETS = ("idle", "system")
CPU_DOMAINS = ("cpu", "dram", "other")


_NO_GPU: Mapping[str, float] = MappingProxyType({})


class PodUsage(NamedTuple):  # a tuple: built per pod per interval, so it must be cheap
    cpu_seconds: float  # this interval
    requests_millicores: float = 0.0
    gpu_use: Mapping[str, float] = _NO_GPU  # gpu zone -> summed SM fraction


@dataclass(frozen=True)
class Attribution:
    pods: Mapping[str, Mapping[str, float]]  # uid -> domain -> joules
    buckets: Mapping[str, Mapping[str, float]]  # idle|system -> domain -> joules


def _clean(x: float) -> float:
    return 0.0 if -1e-9 < x < 0.0 else x


def attribute(
    split: NodeSplit,
    dt: float,
    node_busy_seconds: float,
    pods: Mapping[str, PodUsage],
    *,
    idle_watts: float,
    gpu_idle_watts: Mapping[str, float],
    gpu_other_use: Mapping[str, float],
    policy: str,
) -> Attribution:
    """Split one interval's energy (``split``) among ``pods`` and the idle and system buckets.

    ``gpu_other_use`` is, per GPU, the SM use of processes that belong to no pod.
    """
    if policy not in IDLE_POLICIES:
        raise ValueError(f"idle_policy must be one of {', '.join(IDLE_POLICIES)}, got {policy!r}")
    out: dict[str, dict[str, float]] = {uid: {} for uid in pods}
    idle_bucket: dict[str, float] = {}
    system: dict[str, float] = {}

    # -- CPU, DRAM and the rest of the server: by CPU time and requests -----------------------
    energy = sum(split.domains.get(d, 0.0) for d in CPU_DOMAINS)
    if energy > 0:
        idle = min(max(idle_watts * max(dt, 0.0), 0.0), energy)
        dynamic = energy - idle
        pod_cpu = sum(max(u.cpu_seconds, 0.0) for u in pods.values())
        cpu_total = max(node_busy_seconds, pod_cpu)
        requests = sum(max(u.requests_millicores, 0.0) for u in pods.values())
        idle_to_pods = policy == "requests" and requests > 0
        shares: dict[str, float] = {}
        for uid, usage in pods.items():
            # fractions first (each <= 1), so that no rounding can give a pod more than exists
            share = dynamic * (max(usage.cpu_seconds, 0.0) / cpu_total) if cpu_total > 0 else 0.0
            if idle_to_pods:
                share += idle * (max(usage.requests_millicores, 0.0) / requests)
            shares[uid] = share / energy
        idle_fraction = 0.0 if idle_to_pods else idle / energy
        for domain in CPU_DOMAINS:
            e_d = split.domains.get(domain, 0.0)
            given = 0.0
            for uid, share in shares.items():
                part = share * e_d
                out[uid][domain] = part
                given += part
            idle_bucket[domain] = idle_fraction * e_d
            system[domain] = _clean(e_d - given - idle_bucket[domain])
    else:
        for domain in CPU_DOMAINS:
            for uid in pods:
                out[uid][domain] = 0.0
            idle_bucket[domain] = 0.0
            system[domain] = split.domains.get(domain, 0.0)

    # -- GPUs: by per-process use ------------------------------------------------------------
    for uid in pods:
        out[uid]["gpu"] = 0.0
    idle_bucket["gpu"] = 0.0
    given_gpu = 0.0
    for gpu, e_g in split.gpu_zones.items():
        if e_g <= 0:
            continue
        idle_g = min(max(gpu_idle_watts.get(gpu, 0.0) * max(dt, 0.0), 0.0), e_g)
        dynamic_g = e_g - idle_g
        use = {uid: u.gpu_use.get(gpu, 0.0) for uid, u in pods.items() if u.gpu_use.get(gpu, 0.0) > 0}
        pod_use = sum(use.values())
        all_use = pod_use + max(gpu_other_use.get(gpu, 0.0), 0.0)
        for uid, w in use.items():
            part = dynamic_g * (w / all_use)
            if policy == "requests":
                part += idle_g * (w / pod_use)
            out[uid]["gpu"] += part
            given_gpu += part
        if policy == "bucket" or not use:
            idle_bucket["gpu"] += idle_g
    system["gpu"] = _clean(split.domains.get("gpu", 0.0) - given_gpu - idle_bucket["gpu"])
    return Attribution(out, {"idle": idle_bucket, "system": system})


__all__ = ["BUCKETS", "CPU_DOMAINS", "IDLE_POLICIES", "Attribution", "PodUsage", "attribute"]
