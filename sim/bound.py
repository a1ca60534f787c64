"""The least energy any placement could draw for a run's work, on an always-on cluster.

**Timeline.** A run gives every pod a start and an end. Its work, in reference-core-seconds,
is ``usage × duration`` (the cores it keeps busy × its runtime on a speed-1.0 node), whatever
node it ran on; while it runs it delivers that work at the constant rate
``usage × duration / (end − start)`` reference cores. Summed over the pods in flight this is a
step function R(t); so is the GPU work rate G(t) (``gpu_request × gpu_usage`` per GPU pod, in
reference GPU-seconds), the busy cores U(t) and the requested cores Q(t) of the pods in flight.
Total work is the same for every run; only when it is in flight depends on the run. The bound
reported by ``joulesched sim`` takes the timeline of the ``default`` run (``timeline``), and
:func:`estimate` can take any run's.

**Fluid, cheapest watts first.** At each instant R(t) is served by the cluster's nodes along
their hulls' linear pieces in ascending order of marginal watts per reference core
(``policy/bound.py``): a piece of slope k W per unit utilisation on a node of C cores and speed
s costs k / (C · s) W per reference core and holds C · s · Δu of them. Requests, pod sizes and
which node a pod can fit on are ignored. GPU work is served by GPU nodes in ascending order of
(max − idle watts) / GPU speed. Work beyond every node's full load is free (the power model's
P(1) saturation). Idle power is the same for every placement on an always-on cluster and is
added as it is: Σ (P(0) + GPU idle) × window.

**Request-aware, cheapest node first.** Pods hold whole requests on real nodes, and a node
runs on its curve, not its hull. A node full of requests keeps the share φ(t) = min(1, U(t) /
Q(t)) of its cores busy — the in-flight ratio of busy to requested cores (a pod without a CPU
request counts its usage as its request) — and draws P(φ) − P(0) above idle for φ · C · s
reference cores of work. Nodes are filled whole in ascending order of those watts per
reference core, the last one partly at its real curve point (``policy.bound.
fill_nodes_by_requests``). This is what a scheduler that respects requests and knows every
curve could reach, pod sizes aside; being on the curves, it is never below the fluid figure.

**Cheapest first, as placed.** Both figures above re-pack the work in flight at every instant,
as if running pods could move; a scheduler places each pod once. The third reference is a run
of the simulator with an oracle scheduler that knows every curve: it ranks the nodes by their
dynamic joules per unit of work (``policy.efficiency.cpu_dynamic_joules_per_work``: idle is
spent anyway on an always-on cluster) and packs each pod onto the cheapest node it fits
(MostAllocated among equals), within requests, with no in-tree plugin in the way. It is
reachable by construction, so a policy's share of *its* saving says how much of what
cheapest-watts-first placement buys the policy captures (it can exceed 100 %: the policy sees
each node's load and the steep first step of real curves, the static ranking does not).

The fluid and request-aware figures are estimates of a lower bound, not a proof for every run: a run whose work is spread
more thinly in time than the timeline taken can draw less (the hull is convex, so thinner is
cheaper), and pods that use more cores than they request can push a node past full load for
free. On the timeline of the run itself the fluid figure is a true lower bound of that run's
energy (the tests check it on real runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from joulesched.policy.bound import (
    Pieces,
    concat,
    fill_cheapest_first,
    fill_nodes_by_requests,
    hull_pieces,
    linear_pieces,
)
from joulesched.policy.efficiency import cpu_dynamic_joules_per_work
from joulesched.sim.cluster import ClusterSpec
from joulesched.sim.engine import Engine, EngineOptions, Profile, SimResult
from joulesched.sim.extender import ClusterView, PodRequest
from joulesched.sim.model import Workload


@dataclass(frozen=True)
class Timeline:
    """Step functions on ``[times[k], times[k+1])``; the last step lasts until the window's end."""

    times: np.ndarray
    work_rate: np.ndarray  # reference cores in flight (R)
    gpu_rate: np.ndarray  # reference GPUs in flight (G)
    busy_cores: np.ndarray  # U
    requested_cores: np.ndarray  # Q
    window: float

    @property
    def phi(self) -> np.ndarray:
        q = self.requested_cores
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(q > 0, self.busy_cores / np.where(q > 0, q, 1.0), 1.0)
        return np.asarray(np.clip(ratio, 0.0, 1.0))


def timeline(workload: Workload, result: SimResult) -> Timeline:
    """The run's in-flight work as step functions (pods that never started add nothing)."""
    window = float(result.end_time)
    start = np.asarray(result.pods.start, dtype=float)
    end = np.where(np.isnan(result.pods.end), window, np.asarray(result.pods.end, dtype=float))
    ran = ~np.isnan(start) & (end > start)
    pods = workload.pods
    usage = np.array([p.cpu_usage for p in pods], dtype=float)
    duration = np.array([p.duration for p in pods], dtype=float)
    request = np.array([p.cpu_request if p.cpu_request > 0 else p.cpu_usage for p in pods], dtype=float)
    gpu = np.array([p.gpu_request * p.gpu_usage for p in pods], dtype=float)
    s, e = start[ran], end[ran]
    span = e - s
    cols = np.stack([usage[ran] * duration[ran] / span, gpu[ran] * duration[ran] / span, usage[ran], request[ran]])
    if not ran.any():
        z = np.zeros(1)
        return Timeline(np.zeros(1), z, z, z, z, window)
    times = np.concatenate([s, e])
    deltas = np.concatenate([cols, -cols], axis=1)
    order = np.argsort(times, kind="stable")
    times, deltas = times[order], deltas[:, order]
    levels = np.cumsum(deltas, axis=1)
    # one step per distinct time: the level after the last change at that time
    last = np.append(times[1:] != times[:-1], True)
    t = times[last]
    lv = levels[:, last]
    lv[lv < 1e-9] = 0.0  # no rounding residue once the pods in flight have ended
    if t[0] > 0.0:
        t = np.concatenate([[0.0], t])
        lv = np.concatenate([np.zeros((4, 1)), lv], axis=1)
    return Timeline(t, lv[0], lv[1], lv[2], lv[3], max(window, float(t[-1])))


def cpu_pieces(cluster: ClusterSpec) -> Pieces:
    return concat(
        [hull_pieces(nt.power_curve_watts, nt.cores, nt.speed, nt.count) for nt in cluster.node_types if nt.count]
    )


def gpu_pieces(cluster: ClusterSpec) -> Pieces:
    return concat(
        [
            linear_pieces((nt.gpus.max_watts - nt.gpus.idle_watts) / nt.gpus.speed, nt.gpus.count * nt.gpus.speed * nt.count)
            for nt in cluster.node_types
            if nt.count and nt.gpus.count
        ]
    )


def idle_watts(cluster: ClusterSpec) -> float:
    return float(
        sum(nt.count * (nt.power_curve_watts[0] + nt.gpus.count * nt.gpus.idle_watts) for nt in cluster.node_types)
    )


@dataclass(frozen=True)
class Bound:
    fluid_joules: float
    request_aware_joules: float
    idle_joules: float
    window_seconds: float
    work_core_seconds: float
    gpu_work_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "fluid_energy_joules": self.fluid_joules,
            "request_aware_energy_joules": self.request_aware_joules,
            "idle_energy_joules": self.idle_joules,
            "window_seconds": self.window_seconds,
            "work_reference_core_seconds": self.work_core_seconds,
            "gpu_work_reference_seconds": self.gpu_work_seconds,
        }


def estimate(cluster: ClusterSpec, tl: Timeline, window: float | None = None) -> Bound:
    """Both bounds for a timeline over ``[0, window]`` (the timeline's own window by default)."""
    h = tl.window if window is None else float(window)
    dt = np.diff(np.append(tl.times, max(h, float(tl.times[-1]))))
    cpu = cpu_pieces(cluster)
    fluid_cpu = fill_cheapest_first(tl.work_rate, cpu)
    types = [nt for nt in cluster.node_types if nt.count]
    aware_cpu = (
        fill_nodes_by_requests(
            tl.work_rate,
            tl.phi,
            [nt.power_curve_watts for nt in types],
            [nt.cores for nt in types],
            [nt.speed for nt in types],
            [nt.count for nt in types],
        )
        if types
        else np.zeros(len(dt))
    )
    gpu = gpu_pieces(cluster)
    gpu_w = fill_cheapest_first(tl.gpu_rate, gpu) if len(gpu.cost) else np.zeros(len(dt))
    idle = idle_watts(cluster) * h
    return Bound(
        fluid_joules=idle + float((fluid_cpu + gpu_w) @ dt),
        request_aware_joules=idle + float((aware_cpu + gpu_w) @ dt),
        idle_joules=idle,
        window_seconds=h,
        work_core_seconds=float(tl.work_rate @ dt),
        gpu_work_seconds=float(tl.gpu_rate @ dt),
    )


class CheapestFirst:
    """An oracle extender: every node ranked once by dynamic joules per unit of work, best 10.

    Scores fall in 11 equal rank bands over the cluster's nodes; with a weight that dwarfs the
    in-tree plugins and MostAllocated among equals it packs the cheapest nodes first.
    """

    name = "cheapest-first"
    WEIGHT = 100  # × 10 per score point: far above the in-tree plugins' 0..300

    def __init__(self, cluster: ClusterSpec) -> None:
        nodes = cluster.nodes()
        figure = np.array(
            [
                cpu_dynamic_joules_per_work(
                    cluster.node_types[n.type_index].power_curve_watts,
                    cluster.node_types[n.type_index].cores,
                    cluster.node_types[n.type_index].speed,
                )
                for n in nodes
            ]
        )
        rank = np.argsort(np.argsort(figure, kind="stable"), kind="stable")
        self.scores = (10 - np.minimum(10, rank * 11 // max(len(nodes), 1))).astype(np.int64)
        self.calls = 0

    def decide(
        self, pod: PodRequest, candidates: np.ndarray, view: ClusterView, now: float
    ) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        return np.ones(len(candidates), dtype=bool), self.scores[candidates]

    def close(self) -> None:
        return None


def cheapest_first_energy(cluster: ClusterSpec, workload: Workload, horizon: float, seed: int = 0) -> float:
    """IT energy over ``[0, horizon]`` of the cheapest-first oracle scheduler on this cluster."""
    profile = Profile("cheapest-first", "most", CheapestFirst(cluster), CheapestFirst.WEIGHT)
    engine = Engine(cluster, workload, profile, EngineOptions(seed=seed, record_timeseries=False))
    result = engine.run()
    engine.extend_to(result, max(horizon, float(result.end_time)))
    return float(result.energy_joules.sum())


def share_of_saving(e_default: float, e_policy: float, e_bound: float) -> float | None:
    """(E_default − E_policy) / (E_default − E_bound): 1 = the whole possible saving, None if none is possible."""
    gap = e_default - e_bound
    if gap <= 1e-9 * max(abs(e_default), 1.0):
        return None
    return (e_default - e_policy) / gap


def bound_report(
    cluster: ClusterSpec,
    workload: Workload,
    results: dict[str, SimResult],
    energies: dict[str, float],
    reference: str = "default",
    seed: int = 0,
) -> dict[str, Any]:
    """``results.json``'s ``bound``: both bounds on the reference run's timeline, the cheapest-first
    run, and every policy's share of each.

    Only for an always-on cluster: with the autoscaler on, idle power depends on the placement
    and the bound does not apply (``applicable: false``).
    """
    if cluster.autoscaler.enabled:
        return {
            "applicable": False,
            "reason": "the autoscaler is on: idle power depends on the placement; see the always-on (sensitivity) runs",
        }
    if reference not in results:
        return {"applicable": False, "reason": f"no {reference!r} run to take the timeline from"}
    window = max(float(r.end_time) for r in results.values())
    b = estimate(cluster, timeline(workload, results[reference]), window)
    placed = cheapest_first_energy(cluster, workload, window, seed)
    base = energies[reference]
    own = {name: estimate(cluster, timeline(workload, r), window) for name, r in results.items()}
    policies = {}
    for name, e in energies.items():
        policies[name] = {
            "share_of_bound_saving": {
                "fluid": share_of_saving(base, e, b.fluid_joules),
                "request_aware": share_of_saving(base, e, b.request_aware_joules),
                "cheapest_first": share_of_saving(base, e, placed),
            },
            "own_timeline": {
                "fluid_energy_joules": own[name].fluid_joules,
                "request_aware_energy_joules": own[name].request_aware_joules,
            },
        }
    return {
        "applicable": True,
        "timeline": reference,
        **b.to_dict(),
        "cheapest_first_energy_joules": placed,
        "policies": policies,
    }


def bound_for_runs(
    cluster: ClusterSpec, workload: Workload, runs: dict[str, Any], reference: str = "default", seed: int = 0
) -> dict[str, Any]:
    """:func:`bound_report` for ``runner.PolicyRun`` values."""
    return bound_report(
        cluster,
        workload,
        {n: r.result for n, r in runs.items()},
        {n: float(r.metrics["energy_joules"]) for n, r in runs.items()},
        reference,
        seed,
    )


__all__: Sequence[str] = [
    "Bound",
    "Timeline",
    "bound_for_runs",
    "bound_report",
    "estimate",
    "share_of_saving",
    "timeline",
]
