"""Marginal energy, carbon and scores for one pod over every candidate node at once.

The model (docs/policy.md has the derivation and a worked example):

* node power follows its 11-point curve, linearly interpolated: P(u), u in 0..1;
* the pod adds d cores, so the node's utilisation goes from u0 to u1 = u0 + d/cores, where u0
  is the measured utilisation plus the load predicted for pods recently placed there; past
  u = 1 the node time-shares and the curve continues as P(1) × u;
* a GPU pod adds g GPUs at ``gpu_pod_utilisation``: ΔP_gpu = g × util × (max − idle);
* the pod runs for T / speed (CPU pods) or T / gpu_speed (GPU pods), T being the pod's
  annotated runtime or the reference runtime;
* on a node whose idle power can be avoided (autoscaled or power-managed), the pod also pays
  the idle power it keeps on: P_idle × max(0, runtime − time the node's pods hold it anyway);
* energy E = (P(u1) − P(u0) + ΔP_gpu) × runtime + that idle energy; carbon C = E × PUE × intensity;
* the cost is E (``energy``) or C (``carbon``); the cheapest node the pod could use — over
  every profiled node (``score_scale: cluster``) or over the request's — scores 10 and a node
  whose cost is ``band`` (relative) above it scores 0, linearly in between;
* a node the pod would saturate, and a GPU node for a CPU-only pod, score 0 while another
  candidate has room;
* nodes without a profile or with stale measurements get ``neutral_score``;
* with a power cap, a node fails when its power now plus the pod's would pass
  cap × (1 − headroom).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np

from joulesched.policy.config import MAX_SCORE, PolicyConfig
from joulesched.policy.demand import PodDemand
from joulesched.policy.impact import facility_joules, operational_grams
from joulesched.policy.power import curve_power, gpu_watts
from joulesched.policy.profile import AVOIDABLE_IDLE, NodeArrays

# Reasons a node is not scored on its cost; the explain output and metrics use these words.
REASON_UNKNOWN = "no profile for this node"
REASON_STALE = "measurements older than max_age_seconds"
REASON_SATURATED = "CPU saturated: the pod would push the node past 100 % while another candidate has room"
REASON_GPU_RESERVED = "GPU node kept for GPU work: a CPU-only pod while a CPU node has room"


@dataclass(frozen=True)
class Evaluation:
    """The policy's answer for one pod over candidate nodes (arrays aligned with the input)."""

    known: np.ndarray  # bool: the node has a profile
    fresh: np.ndarray  # bool: known and its measurements are recent enough
    utilisation_before: np.ndarray  # measured + predicted (above 1: oversubscribed)
    utilisation_after: np.ndarray
    node_watts_before: np.ndarray  # model power before the pod (CPU curve + GPUs)
    marginal_watts: np.ndarray  # CPU + GPU
    runtime_seconds: np.ndarray
    idle_energy_joules: np.ndarray  # the node's idle energy the pod makes unavoidable (part of energy)
    energy_joules: np.ndarray  # IT energy of the pod on this node: marginal × runtime + idle
    carbon_grams: np.ndarray  # facility energy × grid intensity
    cost: np.ndarray  # what the strategy minimises
    scores: np.ndarray  # int64 0..10
    failed: np.ndarray  # bool: the power cap filter fails this node
    projected_watts: np.ndarray  # power with the pod, as the cap filter sees it (NaN: no data)
    saturated: np.ndarray  # bool: scored 0 because the pod would saturate the node's CPU
    reserved: np.ndarray  # bool: a GPU node scored 0 for a CPU-only pod while CPU nodes have room

    def reason(self, i: int, cfg: PolicyConfig) -> str:
        if not self.known[i]:
            return REASON_UNKNOWN
        if not self.fresh[i]:
            return REASON_STALE
        if self.failed[i]:
            return f"power cap: projected {self.projected_watts[i]:.0f} W would exceed the cap less {cfg.power_cap_headroom:.0%} headroom"
        return ""

    def top(self) -> np.ndarray | None:
        """The nodes prioritize ranks first (a mask), when they have fresh measurements.

        The fresh nodes the power cap passes with the highest score among them. None when the
        policy has no such preference: no candidate is fresh, or one without fresh
        measurements (scored neutral) outranks every fresh one (e.g. a GPU pod on fresh nodes
        short of GPUs, which score 0).
        """
        # Scores are 0..10: -1 stands for "no such node" in the maxima.
        ok = self.fresh & ~self.failed
        top_score = np.maximum.reduce(self.scores, where=ok, initial=-1)
        if top_score < 0 or np.maximum.reduce(self.scores, where=~(self.failed | self.fresh), initial=-1) > top_score:
            return None
        top: np.ndarray = ok & (self.scores == top_score)
        return top

    def best(self) -> int | None:
        """The position of the node prioritize ranks first: :meth:`cheapest` of :meth:`top`.
        None when :meth:`top` is."""
        top = self.top()
        return None if top is None else self.cheapest(top)

    def cheapest(self, among: np.ndarray) -> int:
        """The position of the lowest cost among the nodes of the mask ``among`` (not empty),
        then the first listed."""
        at = among.nonzero()[0]
        cost = self.cost[at]
        return int(at[np.argmin(np.where(np.isnan(cost), np.inf, cost))])

    def narrowed(self, cfg: PolicyConfig) -> np.ndarray | None:
        """The nodes the extender narrows the choice to (a mask): :meth:`top` with
        ``filter_keeps: top``, :meth:`best` alone with ``best``; None with ``all`` or when the
        policy has no preference (kube-scheduler then chooses among every node the cap passes)."""
        if cfg.filter_keeps == "top":
            return self.top()
        if cfg.filter_keeps == "best" and (best := self.best()) is not None:
            keep = np.zeros(len(self.failed), dtype=bool)
            keep[best] = True
            return keep
        return None

    def kept(self, cfg: PolicyConfig) -> np.ndarray:
        """The nodes filter keeps (a mask): :meth:`narrowed`, else every node the power cap
        passes. Left with one feasible node, kube-scheduler places the pod there without
        scoring, so a node kept alone is where the pod goes, unless a later step of
        kube-scheduler's (Reserve, Permit, the binding) fails it; left with several, its own
        plugins choose (and prioritize, where it is registered)."""
        narrowed = self.narrowed(cfg)
        return ~self.failed if narrowed is None else narrowed

    def passed(self) -> tuple[np.ndarray, Evaluation]:
        """The nodes the power-cap filter passes (their positions), and the evaluation over them alone.

        The same pod over fewer nodes scores each the same when only failed nodes are left
        out: a failed node is never eligible, so it is neither the cheapest nor the one with
        room that demotes a saturating or GPU node (:func:`evaluate`). So kube-scheduler's
        prioritize over the nodes its filter passed is answered by the filter's evaluation.
        """
        keep = (~self.failed).nonzero()[0]
        if len(keep) == len(self.failed):
            return keep, self
        return keep, Evaluation(**{f.name: getattr(self, f.name)[keep] for f in fields(self)})


def normalise(cost: np.ndarray, eligible: np.ndarray, band: float, best: float | None = None) -> np.ndarray:
    """Scores 0..10 from costs: the cheapest node gets 10, ``band`` above it gets 0.

    The cheapest is ``best`` when given (the cluster-wide best, so that a score means the same
    whichever nodes a request carries), else the cheapest eligible entry. Relative, not
    min-max: two nodes 1 % apart score 10 and 10 (min-max would give 10 and 0 and so overrule
    every other plugin). Ineligible entries get 0 here; the caller replaces them. When the
    cheapest cost is 0 (a node with a flat curve), the others are measured against the mean
    eligible cost instead, so that the scale stays relative.
    """
    scores = np.zeros(cost.shape, dtype=np.int64)
    if not np.count_nonzero(eligible):
        return scores
    c = cost[eligible]
    least = float(np.minimum.reduce(c))  # c.min() without ndarray.min's Python wrapper
    if best is None or not np.isfinite(best) or best > least:
        best = least
    scale = best if best > 0 else float(c.sum() / c.size)  # the mean, without np.mean's dispatch
    if scale <= 0 or not np.isfinite(scale):
        scores[eligible] = MAX_SCORE
        return scores
    relative = (c - best) / scale
    raw = MAX_SCORE * (1.0 - relative / band)
    # np.clip's bounds, as the two ufuncs (np.clip's Python wrapper costs twice as much)
    scores[eligible] = np.minimum(np.maximum(np.rint(raw), 0.0), MAX_SCORE).astype(np.int64)
    return scores


def evaluate(
    nodes: NodeArrays,
    rows: np.ndarray,
    pod: PodDemand,
    cfg: PolicyConfig,
    now: float,
    predicted_cores: np.ndarray | None = None,
    predicted_gpus: np.ndarray | None = None,
    held_until: np.ndarray | None = None,
) -> Evaluation:
    """Evaluate ``pod`` on the nodes at ``rows`` of ``nodes`` (``-1``: a node without a profile).

    ``predicted_cores``/``predicted_gpus`` are the demand of pods placed on each node that its
    measurements do not show yet, and ``held_until`` the unix time until which each node's
    current pods keep it powered (NaN: unknown; default: the profiles' ``held_until``). All
    three are aligned with the rows of ``nodes`` (one value per profile), not with ``rows``:
    with ``score_scale: cluster`` the pod is costed on every profiled node, and the scores of
    the requested ones are relative to the best of all, whatever slice of the cluster the
    request carries.
    """
    rows = np.asarray(rows, dtype=np.intp)
    m = rows.shape[0]
    if len(nodes) == 0:
        return _all_unknown(m, cfg)
    known = rows >= 0
    all_known = np.count_nonzero(known) == m
    r = rows if all_known else np.where(known, rows, 0)
    cluster_scale = cfg.score_scale == "cluster"
    # Cost the pod on every profiled node for a cluster-wide best, else on the request's alone.
    # NaN and inf are inputs the costing means to carry (a static profile's missing timestamp,
    # a missing cap, a node short of GPUs costing inf): one errstate for all of it, not one per
    # operation, which cost a tenth of a 100-node evaluation.
    with np.errstate(invalid="ignore"):
        whole = _costs(nodes, None if cluster_scale else r, pod, cfg, now, predicted_cores, predicted_gpus, held_until)

    def align(values: np.ndarray) -> np.ndarray:
        """``values`` (aligned with the costed rows) aligned with the request's rows."""
        return values[r] if cluster_scale else values

    fresh, failed = align(whole.fresh), align(whole.failed)
    if not all_known:
        fresh, failed = known & fresh, known & failed
    cost = align(whole.cost)
    eligible = fresh & ~failed & np.isfinite(cost)
    # Energy alone would fill a node past its cores: on a saturated node the work time-shares
    # at P(1)/c per core, which is cheaper than the steep middle of many real (non-convex)
    # curves. The pods there would run slower, so while another candidate has room a node the
    # pod would saturate scores 0 (it is not filtered: kube-scheduler may still need it).
    saturated = _demote(eligible, align(whole.saturating)) if cfg.avoid_saturation else None
    # A CPU-only pod on a GPU server keeps the most power-hungry servers on and takes room
    # that GPU work needs: while a CPU node in the request has room, GPU nodes score 0.
    reserved = _demote(eligible, align(whole.gpu_node)) if whole.reserve and whole.gpu_node is not None else None
    best = whole.best if cluster_scale else None
    scores = normalise(cost, eligible, cfg.band, best=best)
    scores[~fresh | np.isnan(cost)] = cfg.neutral_score  # a cost that cannot be known (a site's intensity)
    scores[failed] = 0

    # The per-node figures, aligned with the request's rows; NaN for a node without a profile.
    figures: tuple[np.ndarray, ...] = (whole.u0, whole.u1, whole.watts_before, whole.marginal, whole.runtime, whole.idle_energy,
                                       whole.energy, whole.carbon, whole.cost, whole.projected)  # fmt: skip
    if cluster_scale:
        figures = tuple(values[r] for values in figures)
    if not all_known:
        figures = tuple(np.where(known, values, np.nan) for values in figures)
    u0, u1, watts_before, marginal, runtime, idle_energy, energy, carbon, cost_taken, projected = figures
    return Evaluation(
        known=known,
        fresh=fresh,
        utilisation_before=u0,
        utilisation_after=u1,
        node_watts_before=watts_before,
        marginal_watts=marginal,
        runtime_seconds=runtime,
        idle_energy_joules=idle_energy,
        energy_joules=energy,
        carbon_grams=carbon,
        cost=cost_taken,
        scores=scores,
        failed=failed,
        projected_watts=projected,
        saturated=np.zeros(m, dtype=bool) if saturated is None else saturated,
        reserved=np.zeros(m, dtype=bool) if reserved is None else reserved,
    )


def _demote(eligible: np.ndarray, flagged: np.ndarray) -> np.ndarray | None:
    """Take the flagged entries out of ``eligible`` (in place) when some eligible entry is not
    flagged, and return them; else None, ``eligible`` as it was."""
    over: np.ndarray = eligible & flagged
    flagged_count = np.count_nonzero(over)
    if flagged_count and flagged_count < np.count_nonzero(eligible):  # (over is within eligible)
        eligible &= ~over
        return over
    return None


class _Costs(NamedTuple):
    """The pod costed on a set of profile rows (arrays aligned with them).

    A tuple, not a frozen dataclass: built once a request, where a frozen dataclass's
    sixteen guarded assignments cost about a tenth of a 100-node evaluation.
    """

    fresh: np.ndarray
    failed: np.ndarray
    u0: np.ndarray
    u1: np.ndarray
    watts_before: np.ndarray
    marginal: np.ndarray
    runtime: np.ndarray
    idle_energy: np.ndarray
    energy: np.ndarray
    carbon: np.ndarray
    cost: np.ndarray
    projected: np.ndarray
    saturating: np.ndarray  # the pod would push the node past its cores
    gpu_node: np.ndarray | None  # the node has GPUs (None: no node of the set has)
    reserve: bool  # cfg.reserve_gpu_nodes applies to this pod
    best: float  # the least cost over the rows that could be chosen (NaN: none; computed over every node only)


def _costs(
    nodes: NodeArrays,
    over: np.ndarray | None,
    pod: PodDemand,
    cfg: PolicyConfig,
    now: float,
    predicted_cores: np.ndarray | None,
    predicted_gpus: np.ndarray | None,
    held_until: np.ndarray | None,
) -> _Costs:
    """The pod on the profile rows ``over`` (every row when None); per-node inputs aligned with the profiles.

    Called under ``np.errstate(invalid="ignore")`` (:func:`evaluate`).
    """
    if over is None:
        table, curve = nodes.table, nodes.curve
    else:  # one gather for every per-node number (take: a third of a 2-D fancy index's time at 5,000 rows)
        table, curve = nodes.table.take(over, axis=0), nodes.curve.take(over, axis=0)
        predicted_cores = None if predicted_cores is None else predicted_cores[over]
        predicted_gpus = None if predicted_gpus is None else predicted_gpus[over]
        held_until = None if held_until is None else held_until[over]
    (cores, u_measured, speed_cpu, pue, intensity, measured, cap, updated,
     gpu_count, gpu_idle, gpu_max, gpu_speed, gpu_util, idle_avoidable, held_profile) = table.T  # fmt: skip
    n = table.shape[0]
    fresh = ~(now - updated > cfg.max_age_seconds)  # NaN timestamps: static profiles are always fresh

    # The utilisation measured, with the predicted pods (u0) and with this pod too (u1), written
    # into one array for one pass over the curves.
    u = np.empty((3, n))
    u[0] = u_measured
    if predicted_cores is None:
        u[1] = u_measured
    else:
        np.maximum(u_measured + predicted_cores / cores, 0.0, out=u[1])
    np.add(u[1], pod.cpu_cores / cores, out=u[2])
    u0, u1 = u[1], u[2]
    p_measured, p0, p1 = curve_power(curve, u)
    cpu_dw = p1 - p0

    # The set's facts decide which terms apply (NodeArrays.any_gpus, idle_classes): a term that
    # applies to no node of the set is left out rather than computed as zeros.
    has_gpus = gpu_count > 0 if nodes.any_gpus else None
    if pod.gpus > 0 or has_gpus is not None:
        gpu_span = gpu_max - gpu_idle
        gpu_busy = gpu_util * gpu_count
        gpu_measured: np.ndarray | None = None  # the GPUs' power at their measured use
        if predicted_gpus is not None:
            gpu_measured = gpu_watts(gpu_count, gpu_idle, gpu_max, gpu_busy)
            gpu_busy = gpu_busy + predicted_gpus * cfg.gpu_pod_utilisation
        gpu_now: np.ndarray | None = gpu_watts(gpu_count, gpu_idle, gpu_max, gpu_busy)
    else:
        gpu_now = gpu_measured = None  # no GPU draws power: the terms below leave it out
    if pod.gpus > 0:
        usable = np.minimum(float(pod.gpus), np.maximum(gpu_count - gpu_busy, 0.0))
        gpu_dw = np.where(gpu_count < pod.gpus, np.inf, usable * cfg.gpu_pod_utilisation * gpu_span)
        marginal = cpu_dw + gpu_dw
        speed = gpu_speed
    else:
        marginal = cpu_dw
        speed = speed_cpu

    base_runtime = pod.runtime_seconds if pod.runtime_seconds is not None else cfg.reference_runtime_seconds
    runtime = base_runtime / speed
    avoidable = _avoidable(idle_avoidable, cfg) if idle_power_avoidable(nodes, cfg) else None
    if avoidable is not None and np.count_nonzero(avoidable):
        idle_energy = _unavoidable_idle_joules(
            # the node's idle power: P(0) and its GPUs' (gpu_watts at no use, count × idle)
            curve[:, 0] + gpu_count * gpu_idle, runtime, avoidable, held_profile if held_until is None else held_until, now
        )
        energy = marginal * runtime + idle_energy  # inf marginal (a node short of GPUs) + idle
    else:  # an always-on cluster: no idle power to answer for
        idle_energy = np.zeros(n)
        energy = marginal * runtime
    carbon = operational_grams(facility_joules(energy, pue), intensity)  # inf energy × 0 g/kWh: NaN
    if pod.gpus > 0:
        carbon = np.where(np.isinf(energy), np.inf, carbon)
    cost = energy if cfg.strategy == "energy" else carbon

    # Power now: measured where there is a measurement, else the model; plus what the
    # predicted (not yet measured) pods add, on the CPUs and the GPUs, plus this pod.
    modelled = p_measured if gpu_now is None else p_measured + gpu_now
    measured_now = measured if gpu_now is None or gpu_measured is None else measured + (gpu_now - gpu_measured)
    now_watts = np.where(np.isnan(measured), modelled, measured_now) + (p0 - p_measured)
    projected = now_watts + marginal
    if cfg.power_cap_enabled:
        failed = fresh & (projected > cap * (1.0 - cfg.power_cap_headroom))  # NaN cap: uncapped, False
    else:
        failed = np.zeros(n, dtype=bool)

    saturating = u1 > 1.0 + 1e-9 if pod.cpu_cores > 0 else np.zeros(n, dtype=bool)
    reserve = cfg.reserve_gpu_nodes and pod.gpus == 0 and has_gpus is not None and bool(np.count_nonzero(has_gpus))
    best = float("nan")
    if over is None:  # the best node of the cluster, by the same rules as the candidates
        choosable = fresh & ~failed & np.isfinite(cost)
        if cfg.avoid_saturation:
            _demote(choosable, saturating)
        if reserve and has_gpus is not None:
            _demote(choosable, has_gpus)
        if np.count_nonzero(choosable):
            best = float(np.minimum.reduce(cost[choosable]))
    return _Costs(
        fresh=fresh,
        failed=failed,
        u0=u0,
        u1=u1,
        watts_before=p0 if gpu_now is None else p0 + gpu_now,
        marginal=marginal,
        runtime=runtime,
        idle_energy=idle_energy,
        energy=energy,
        carbon=carbon,
        cost=cost,
        projected=projected,
        saturating=saturating,
        gpu_node=has_gpus,
        reserve=reserve,
        best=best,
    )


def _avoidable(idle_avoidable: np.ndarray, cfg: PolicyConfig) -> np.ndarray:
    """1 where a node's idle power can be avoided: its profile's say, else the policy's ``idle_power``."""
    avoidable: np.ndarray = np.where(np.isnan(idle_avoidable), float(cfg.idle_power in AVOIDABLE_IDLE), idle_avoidable)
    return avoidable


def idle_power_avoidable(nodes: NodeArrays, cfg: PolicyConfig) -> bool:
    """Whether any profiled node's idle power can be avoided, so that the pods holding nodes
    (``held_until``) count in :func:`evaluate`; where none can, they do not (an always-on
    cluster), and a caller need not work them out."""
    explicit, unset = nodes.idle_classes
    return explicit or (unset and cfg.idle_power in AVOIDABLE_IDLE)


def _unavoidable_idle_joules(
    idle_watts: np.ndarray, runtime: np.ndarray, avoidable: np.ndarray, held_until: np.ndarray, now: float
) -> np.ndarray:
    """The idle energy a pod makes unavoidable on each node (docs/policy.md, "Idle power").

    A node whose idle power can be avoided (``avoidable`` 1: autoscaled or power-managed) and
    that its current pods keep powered until ``held_until`` stays on for the pod only for the
    part of the pod's runtime that outlasts them::

        idle J = P_idle × max(0, runtime − max(0, held_until − now))

    so an empty node (``held_until`` ≤ now) charges its whole idle power for the runtime, and a
    node whose pods outlast the new one charges nothing. ``held_until`` NaN (unknown: e.g. a
    long-running service whose end nobody knows) counts as held for good. An always-on node
    (``avoidable`` 0) draws its idle power whatever the scheduler does: nothing is charged.
    """
    with np.errstate(invalid="ignore"):
        held_for = np.where(np.isnan(held_until), np.inf, np.maximum(held_until - now, 0.0))
        extra = np.maximum(runtime - held_for, 0.0)
    joules: np.ndarray = np.where(avoidable > 0.5, idle_watts * extra, 0.0)
    return joules


def _all_unknown(n: int, cfg: PolicyConfig) -> Evaluation:
    nan = np.full(n, np.nan)
    false = np.zeros(n, dtype=bool)
    return Evaluation(
        known=false,
        fresh=false,
        utilisation_before=nan,
        utilisation_after=nan,
        node_watts_before=nan,
        marginal_watts=nan,
        runtime_seconds=nan,
        idle_energy_joules=nan,
        energy_joules=nan,
        carbon_grams=nan,
        cost=nan,
        scores=np.full(n, cfg.neutral_score, dtype=np.int64),
        failed=false,
        projected_watts=nan,
        saturated=false,
        reserved=false,
    )
