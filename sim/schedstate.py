"""kube-scheduler's view of the nodes: what each can hold and what its pods request, and the filter
and score plugins of :mod:`sim.kube` over it.

One class, :class:`SchedulingState`, used by the simulator's engine to place pods and by
``joulesched sim run --scheduler kube`` to judge the real kube-scheduler's placements: the replay
validates the engine's own arithmetic, not a copy of it.

Per node (int64 arrays): allocatable ``alloc_*`` (millicores, bytes, GPUs, ``max_pods``),
``req_*`` (the sum of the bound pods' requests), ``nz_*`` (the same with kube-scheduler's
non-zero defaults for pods that request nothing: 100 m CPU, 200 MiB), ``npods``, and
``free_* = alloc_* − req_*`` kept up to date; per pod group and node, ``group_host`` (how many
pods of the group the node runs).

* :meth:`fits`: NodeResourcesFit's filter — ``free ≥ request`` for every resource requested,
  and ``free_pods ≥ 1``.
* :meth:`scores`: the weighted sum of the score plugins that can differ between nodes —
  NodeResourcesFit (LeastAllocated or MostAllocated on ``nz + the pod's non-zero request``),
  NodeResourcesBalancedAllocation (on ``req + the pod's request``; skipped for a pod that
  requests neither CPU nor memory) and, for a pod with a group, PodTopologySpread over the
  candidates; the formulas are :mod:`sim.kube`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from joulesched.sim import kube
from joulesched.sim.cluster import ClusterSpec, Node
from joulesched.sim.model import PodSpec

FIT_STRATEGIES = ("least", "most")  # NodeResourcesFit LeastAllocated | MostAllocated


class PodNeeds:
    """One pod's requests as kube-scheduler counts them, with the non-zero forms it scores with:
    ``nz_cpu`` is the CPU request or, without one, kube-scheduler's default (100 m); ``nz_mem``
    likewise (200 MiB)."""

    __slots__ = ("cpu", "gpu", "gpu_models", "group", "mem", "nz_cpu", "nz_mem")

    def __init__(self, cpu: int, mem: int, gpu: int, group: int = -1, gpu_models: tuple[str, ...] = ()) -> None:
        self.cpu = cpu  # millicores
        self.mem = mem  # bytes
        self.gpu = gpu
        self.group = group  # index of the pod's group, -1: none
        self.gpu_models = gpu_models  # NodeAffinity on the GPU product label; (): any node
        self.nz_cpu = cpu if cpu > 0 else kube.DEFAULT_MILLI_CPU_REQUEST
        self.nz_mem = mem if mem > 0 else kube.DEFAULT_MEMORY_REQUEST

    def __repr__(self) -> str:
        return f"PodNeeds(cpu={self.cpu}, mem={self.mem}, gpu={self.gpu}, group={self.group})"


def needs_of(pod: PodSpec, group: int = -1) -> PodNeeds:
    """A trace pod's requests in kube-scheduler's units (``Quantity`` rounding up)."""
    return PodNeeds(
        kube.milli_cpu(pod.cpu_request), math.ceil(pod.memory_request), int(pod.gpu_request), group, pod.gpu_models
    )


class SchedulingState:
    """What the pods bound to each node request, and kube-scheduler's filter and scores on it."""

    def __init__(
        self, cluster: ClusterSpec, fit_strategy: str, groups: int = 0, nodes: Sequence[Node] | None = None
    ) -> None:
        if fit_strategy not in FIT_STRATEGIES:
            raise ValueError(f"fit strategy must be one of {', '.join(FIT_STRATEGIES)}, got {fit_strategy!r}")
        nodes = cluster.nodes() if nodes is None else nodes
        types = [cluster.node_types[nd.type_index] for nd in nodes]
        n = len(nodes)
        self.n = n
        self.fit_strategy = fit_strategy
        self.alloc_cpu = np.array([kube.milli_cpu(t.cores) for t in types], dtype=np.int64)
        self.alloc_mem = np.array([math.ceil(t.memory_bytes) for t in types], dtype=np.int64)
        self.alloc_gpu = np.array([t.gpus.count for t in types], dtype=np.int64)
        self.gpu_model = np.array([t.gpus.model for t in types], dtype=object)
        self.max_pods = np.array([t.max_pods for t in types], dtype=np.int64)
        if not (self.alloc_cpu > 0).all() or not (self.alloc_mem > 0).all():
            raise ValueError("every node needs allocatable CPU and memory > 0 (kube.least_requested divides by them)")
        self.req_cpu = np.zeros(n, dtype=np.int64)
        self.req_mem = np.zeros(n, dtype=np.int64)
        self.req_gpu = np.zeros(n, dtype=np.int64)
        self.nz_cpu = np.zeros(n, dtype=np.int64)
        self.nz_mem = np.zeros(n, dtype=np.int64)
        self.npods = np.zeros(n, dtype=np.int64)
        self.free_cpu = self.alloc_cpu.copy()
        self.free_mem = self.alloc_mem.copy()
        self.free_gpu = self.alloc_gpu.copy()
        self.free_pods = self.max_pods.copy()
        zones = sorted({nd.zone for nd in nodes})
        self.zone_of = np.array([zones.index(nd.zone) for nd in nodes], dtype=np.int64)
        self.n_zones = len(zones)
        self.group_host = np.zeros((groups, n), dtype=np.int64)

    def fits(self, p: PodNeeds) -> np.ndarray:
        """NodeResourcesFit's filter over every node: room for each resource requested and one more
        pod; and NodeAffinity's, for a pod that accepts only some GPU models."""
        fit = self.free_pods > 0
        if p.gpu_models:
            fit &= np.isin(self.gpu_model, p.gpu_models)
        if p.cpu:
            fit &= self.free_cpu >= p.cpu
        if p.mem:
            fit &= self.free_mem >= p.mem
        if p.gpu:
            fit &= self.free_gpu >= p.gpu
        return fit

    def scores(self, p: PodNeeds, cand: np.ndarray) -> np.ndarray:
        """The plugins' weighted total for ``p`` on each node of ``cand`` (indices; the constant plugins left out)."""
        a_cpu, a_mem = self.alloc_cpu[cand], self.alloc_mem[cand]
        total = kube.WEIGHTS["NodeResourcesFit"] * kube.resource_fit_score(
            self.fit_strategy, self.nz_cpu[cand] + p.nz_cpu, a_cpu, self.nz_mem[cand] + p.nz_mem, a_mem
        )
        if p.cpu or p.mem:  # BalancedAllocation skips best-effort pods
            req_cpu, req_mem = self.req_cpu[cand], self.req_mem[cand]
            total = total + kube.WEIGHTS["NodeResourcesBalancedAllocation"] * kube.balanced_allocation_score(
                req_cpu + p.cpu, a_cpu, req_mem + p.mem, a_mem, req_cpu, req_mem
            )
        if p.group >= 0:
            host = self.group_host[p.group]
            zone_totals = np.bincount(self.zone_of, weights=host, minlength=self.n_zones)
            zones = self.zone_of[cand]
            spread = kube.topology_spread_scores(host[cand], zone_totals[zones], len(np.unique(zones)))
            total = total + kube.WEIGHTS["PodTopologySpread"] * spread
        return total

    def bind(self, p: PodNeeds, node: int, sign: int = 1) -> None:
        """``p`` is bound to ``node`` (``sign = -1``: it left)."""
        self.req_cpu[node] += sign * p.cpu
        self.req_mem[node] += sign * p.mem
        self.req_gpu[node] += sign * p.gpu
        self.free_cpu[node] -= sign * p.cpu
        self.free_mem[node] -= sign * p.mem
        self.free_gpu[node] -= sign * p.gpu
        self.free_pods[node] -= sign
        self.nz_cpu[node] += sign * p.nz_cpu
        self.nz_mem[node] += sign * p.nz_mem
        self.npods[node] += sign
        if p.group >= 0:
            self.group_host[p.group, node] += sign

    def unbind(self, p: PodNeeds, node: int) -> None:
        """``p`` left ``node``: the inverse of :meth:`bind`."""
        self.bind(p, node, -1)
