"""kube-scheduler's filter and score arithmetic, as plain functions over numpy arrays.

Reproduced from ``k8s.io/kubernetes/pkg/scheduler`` (default profile; checked against the real
v1.37.2 kube-scheduler by ``joulesched sim run --scheduler kube``):

* **Filter** ``NodeResourcesFit``: a pod fits when, for every resource it requests, the
  request is at most allocatable minus what pods on the node already request; and the node
  has room for one more pod (``maxPods``).
* **Score** (each plugin 0..100, times its weight, summed):

  ==================================  ======  ==============================================
  plugin                              weight  here
  ==================================  ======  ==============================================
  NodeResourcesFit (LeastAllocated)   1       modelled: :func:`least_allocated_score`
  NodeResourcesBalancedAllocation     1       modelled: :func:`balanced_allocation_score` (the
                                              balance improvement, as in v1.37)
  PodTopologySpread                   2       modelled for pods with a ``group`` (the system
                                              default constraints apply only to pods that a
                                              Service/ReplicaSet/StatefulSet/RC selects; bare
                                              pods — Nextflow tasks, Jobs — skip it)
  TaintToleration                     3       constant (no taints): 100 on every node
  NodeAffinity                        2       constant (no preferred affinity): skipped
  InterPodAffinity                    2       constant (no affinity terms): skipped
  ImageLocality                       1       constant (images are not modelled)
  VolumeBinding                       1       constant (no volumes): skipped
  ==================================  ======  ==============================================

  Constant plugins shift every node's total equally and never change a placement, so they
  are left out of the totals.
* **Extenders**: ``score × weight × (MaxNodeScore / MaxExtenderPriority)`` = ``score × weight ×
  10`` is added to the plugins' total; the highest total wins, ties broken uniformly at random
  (kube-scheduler's ``selectHost`` reservoir-samples among the tied).
* **percentageOfNodesToScore**: :func:`num_feasible_nodes_to_find`; filtering walks the node
  list from a rotating start index and stops when that many feasible nodes are found.

Integer arithmetic follows Go's (int64, division truncating toward zero; every operand here is
non-negative, so floor division is the same).
"""

from __future__ import annotations

import math

import numpy as np

MAX_NODE_SCORE = 100  # framework.MaxNodeScore
MAX_EXTENDER_PRIORITY = 10  # extenderv1.MaxExtenderPriority
EXTENDER_SCALE = MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY
DEFAULT_MILLI_CPU_REQUEST = 100  # schedutil.DefaultMilliCPURequest
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024  # schedutil.DefaultMemoryRequest
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5
DEFAULT_PERCENTAGE_OF_NODES_TO_SCORE = 0  # 0: adaptive

WEIGHTS = {
    "TaintToleration": 3,
    "NodeAffinity": 2,
    "NodeResourcesFit": 1,
    "PodTopologySpread": 2,
    "InterPodAffinity": 2,
    "NodeResourcesBalancedAllocation": 1,
    "ImageLocality": 1,
}
# Default system spreading constraints (PodTopologySpread, whenUnsatisfiable: ScheduleAnyway).
SYSTEM_SPREAD_HOSTNAME_MAX_SKEW = 3
SYSTEM_SPREAD_ZONE_MAX_SKEW = 5


def num_feasible_nodes_to_find(percentage: int, num_all_nodes: int) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering."""
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return num_all_nodes
    if percentage == 0:
        percentage = 50 - num_all_nodes // 125
        if percentage < MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND:
            percentage = MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND
    num = num_all_nodes * percentage // 100
    if num < MIN_FEASIBLE_NODES_TO_FIND:
        return MIN_FEASIBLE_NODES_TO_FIND
    return num


def milli_cpu(cores: float) -> int:
    """A CPU quantity in millicores as ``Quantity.MilliValue()`` gives it (rounded up)."""
    return math.ceil(round(cores * 1000.0, 6))


def least_requested(requested: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """``leastRequestedScore``: ``(capacity − requested) × 100 / capacity``, 0 when over.

    ``capacity`` > 0 on every node (a cluster file's nodes have cores and memory; kube-scheduler
    scores a resource of capacity 0 as 0 and :class:`sim.schedstate.SchedulingState` refuses such
    a node).
    """
    score: np.ndarray = np.maximum(capacity - requested, 0) * MAX_NODE_SCORE // capacity
    return score


def most_requested(requested: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """``mostRequestedScore``: ``min(requested, capacity) × 100 / capacity`` (``capacity`` > 0)."""
    score: np.ndarray = np.minimum(requested, capacity) * MAX_NODE_SCORE // capacity
    return score


def resource_fit_score(
    strategy: str,
    cpu_requested: np.ndarray,
    cpu_allocatable: np.ndarray,
    mem_requested: np.ndarray,
    mem_allocatable: np.ndarray,
) -> np.ndarray:
    """NodeResourcesFit score with the default resources (cpu and memory, weight 1 each):
    ``(score_cpu + score_mem) / 2`` in Go integer arithmetic.

    ``*_requested`` are the node's NonZeroRequested plus the pod's non-zero request;
    ``*_allocatable`` > 0. ``strategy``: ``least`` (LeastAllocated) or ``most`` (MostAllocated).
    """
    scorer = least_requested if strategy == "least" else most_requested
    score: np.ndarray = (scorer(cpu_requested, cpu_allocatable) + scorer(mem_requested, mem_allocatable)) // 2
    return score


def _balance(
    cpu_requested: np.ndarray, cpu_allocatable: np.ndarray, mem_requested: np.ndarray, mem_allocatable: np.ndarray
) -> np.ndarray:
    """``balancedResourceScore``: ``(1 − |f_cpu − f_mem| / 2) × 100``, truncated; fractions capped at 1."""
    fc = np.minimum(cpu_requested / cpu_allocatable, 1.0)
    fm = np.minimum(mem_requested / mem_allocatable, 1.0)
    std = np.abs((fc - fm) / 2.0)
    score: np.ndarray = ((1.0 - std) * float(MAX_NODE_SCORE)).astype(np.int64)
    return score


def balanced_allocation_score(
    cpu_requested: np.ndarray,
    cpu_allocatable: np.ndarray,
    mem_requested: np.ndarray,
    mem_allocatable: np.ndarray,
    cpu_allocated: np.ndarray | None = None,
    mem_allocated: np.ndarray | None = None,
) -> np.ndarray:
    """NodeResourcesBalancedAllocation.

    ``*_requested`` are the node's Requested (not NonZero) plus the pod's request;
    ``*_allocated`` the node's Requested without the pod. kube-scheduler v1.37 scores how much
    the pod *improves* the node's balance: with ``b(x) = (1 − |f_cpu − f_mem| / 2) × 100``
    (truncated, fractions capped at 1), ``50 + (50 + b(with pod) − b(without)) / 2`` in Go
    integer arithmetic. Without ``*_allocated`` this is the score of v1.34 and earlier,
    ``b(with pod)`` alone. The caller skips the plugin for a pod that requests neither resource.
    """
    with_pod = _balance(cpu_requested, cpu_allocatable, mem_requested, mem_allocatable)
    if cpu_allocated is None or mem_allocated is None:
        return with_pod
    without = _balance(cpu_allocated, cpu_allocatable, mem_allocated, mem_allocatable)
    half = MAX_NODE_SCORE // 2
    # b() is in [50, 100], so the dividend is in [0, 100]: floor division is Go's truncation.
    improvement: np.ndarray = half + (half + with_pod - without) // 2
    return improvement


def topology_spread_scores(host_counts: np.ndarray, zone_counts: np.ndarray, zones_in_filtered: int) -> np.ndarray:
    """PodTopologySpread with the system default constraints, normalised to 0..100.

    ``host_counts[i]``: pods of the same group on candidate ``i``; ``zone_counts[i]``: pods of
    the group in candidate ``i``'s zone (counted over all nodes); ``zones_in_filtered``: how
    many zones the candidates span.
    """
    n = len(host_counts)
    w_host = math.log(n + 2)
    w_zone = math.log(zones_in_filtered + 2)
    raw = (
        host_counts * w_host
        + (SYSTEM_SPREAD_HOSTNAME_MAX_SKEW - 1)
        + zone_counts * w_zone
        + (SYSTEM_SPREAD_ZONE_MAX_SKEW - 1)
    )
    score = np.floor(raw + 0.5).astype(np.int64)  # Go's math.Round (half away from zero), raw >= 0
    lo, hi = int(score.min()), int(score.max())
    if hi == 0:
        return np.full(n, MAX_NODE_SCORE, dtype=np.int64)
    return MAX_NODE_SCORE * (hi + lo - score) // hi


def extender_contribution(scores: np.ndarray, weight: int) -> np.ndarray:
    """What an extender's 0..10 scores add to the total: ``score × weight × 10``."""
    return scores.astype(np.int64) * weight * EXTENDER_SCALE


def select_host(total: np.ndarray, rng: np.random.Generator) -> int:
    """The index of a highest total, uniformly at random among ties."""
    best = total.max()
    tied = np.flatnonzero(total == best)
    if len(tied) == 1:
        return int(tied[0])
    return int(tied[rng.integers(len(tied))])
