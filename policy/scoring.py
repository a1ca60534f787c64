"""Marginal energy, carbon and scores for one pod over every candidate node at once.

The model (docs/policy.md has the derivation and a worked example):

* node power follows its 11-point curve, linearly interpolated: P(u), u in 0..1;
* the pod adds d cores, so the node's utilisation goes from u0 to u1 = u0 + d/cores, where u0
  is the measured utilisation plus the load predicted for pods recently placed there; past
  u = 1 the node time-shares and the curve continues as P(1) × u;
* a GPU pod adds g GPUs at ``gpu_pod_utilisation``: ΔP_gpu = g × util × (max − idle);
* the pod runs for T / speed (CPU pods) or T / gpu_speed (GPU pods), T being the pod's
  annotated runtime or the reference runtime;
* marginal energy E = (P(u1) − P(u0) + ΔP_gpu) × runtime; carbon C = E × PUE × intensity;
* the cost is E (``energy``) or C (``carbon``); the cheapest fresh node scores 10 and a node
  whose cost is ``band`` (relative) above the cheapest scores 0, linearly in between;
* nodes without a profile or with stale measurements get ``neutral_score``;
* with a power cap, a node fails when its power now plus the pod's would pass
  cap × (1 − headroom).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policy.config import MAX_SCORE, PolicyConfig
from policy.demand import PodDemand
from policy.profile import CURVE_POINTS, NodeArrays

JOULES_PER_KWH = 3.6e6

# Reasons a node is not scored on its cost; the explain output and metrics use these words.
REASON_UNKNOWN = "no profile for this node"
REASON_STALE = "measurements older than max_age_seconds"


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
    energy_joules: np.ndarray  # IT energy of the pod on this node
    carbon_grams: np.ndarray  # facility energy × grid intensity
    cost: np.ndarray  # what the strategy minimises
    scores: np.ndarray  # int64 0..10
    failed: np.ndarray  # bool: the power cap filter fails this node
    projected_watts: np.ndarray  # power with the pod, as the cap filter sees it (NaN: no data)

    def reason(self, i: int, cfg: PolicyConfig) -> str:
        if not self.known[i]:
            return REASON_UNKNOWN
        if not self.fresh[i]:
            return REASON_STALE
        if self.failed[i]:
            return f"power cap: projected {self.projected_watts[i]:.0f} W would exceed the cap less {cfg.power_cap_headroom:.0%} headroom"
        return ""


def curve_power(curve: np.ndarray, utilisation: np.ndarray) -> np.ndarray:
    """P(u) for each row's curve, linear between the 11 points.

    Demand beyond the node's capacity (u > 1) is time-shared: the work takes u times as long
    at full power, so the curve continues as P(1) × u. A saturated node is therefore the
    most expensive place for more work, never a free one (clipping at 1 would make its
    marginal power zero and let a full node win every pod of a burst).
    """
    u = np.maximum(utilisation, 0.0)
    x = np.minimum(u, 1.0) * (CURVE_POINTS - 1)
    lo = np.minimum(np.floor(x).astype(np.intp), CURVE_POINTS - 2)
    frac = x - lo
    rows = np.arange(curve.shape[0])
    inside = curve[rows, lo] * (1.0 - frac) + curve[rows, lo + 1] * frac
    return inside + np.maximum(u - 1.0, 0.0) * curve[rows, CURVE_POINTS - 1]


def normalise(cost: np.ndarray, eligible: np.ndarray, band: float) -> np.ndarray:
    """Scores 0..10 from costs: the cheapest eligible node gets 10, ``band`` above it gets 0.

    Relative, not min-max: two nodes 1 % apart score 10 and 10 (min-max would give 10 and 0
    and so overrule every other plugin). Ineligible entries get 0 here; the caller replaces
    them. When the cheapest cost is 0 (a node with a flat curve), the others are measured
    against the mean eligible cost instead, so that the scale stays relative.
    """
    scores = np.zeros(cost.shape, dtype=np.int64)
    if not eligible.any():
        return scores
    c = cost[eligible]
    best = float(c.min())
    scale = best if best > 0 else float(c.mean())
    if scale <= 0 or not np.isfinite(scale):
        scores[eligible] = MAX_SCORE
        return scores
    relative = (c - best) / scale
    raw = MAX_SCORE * (1.0 - relative / band)
    scores[eligible] = np.clip(np.rint(raw), 0, MAX_SCORE).astype(np.int64)
    return scores


def evaluate(
    nodes: NodeArrays,
    rows: np.ndarray,
    pod: PodDemand,
    cfg: PolicyConfig,
    now: float,
    predicted_cores: np.ndarray | None = None,
    predicted_gpus: np.ndarray | None = None,
) -> Evaluation:
    """Evaluate ``pod`` on the nodes at ``rows`` of ``nodes`` (``-1``: a node without a profile).

    ``predicted_cores``/``predicted_gpus`` (aligned with ``rows``) are the demand of pods placed
    on each node that its measurements do not show yet.
    """
    rows = np.asarray(rows, dtype=np.intp)
    known = rows >= 0
    r = np.where(known, rows, 0)
    if len(nodes) == 0:
        # Nothing is known: every candidate is neutral, computed on a dummy row.
        return _all_unknown(rows.shape[0], cfg)
    updated = nodes.updated[r]
    fresh = known & (np.isnan(updated) | (now - updated <= cfg.max_age_seconds))

    cores = nodes.cores[r]
    extra = np.zeros(rows.shape[0]) if predicted_cores is None else np.asarray(predicted_cores, dtype=np.float64)
    u_measured = nodes.utilisation[r]
    u0 = np.maximum(u_measured + extra / cores, 0.0)
    u1 = u0 + pod.cpu_cores / cores
    curve = nodes.curve[r]
    p_measured = curve_power(curve, u_measured)
    p0 = curve_power(curve, u0)
    cpu_dw = curve_power(curve, u1) - p0

    gpu_count = nodes.gpu_count[r]
    gpu_span = nodes.gpu_max_watts[r] - nodes.gpu_idle_watts[r]
    gpu_busy = nodes.gpu_utilisation[r] * gpu_count
    if predicted_gpus is not None:
        gpu_busy = gpu_busy + np.asarray(predicted_gpus, dtype=np.float64) * cfg.gpu_pod_utilisation
    gpu_now = gpu_count * nodes.gpu_idle_watts[r] + np.minimum(gpu_busy, gpu_count) * gpu_span
    if pod.gpus > 0:
        usable = np.minimum(float(pod.gpus), np.maximum(gpu_count - gpu_busy, 0.0))
        shortfall = gpu_count < pod.gpus
        gpu_dw = np.where(shortfall, np.inf, usable * cfg.gpu_pod_utilisation * gpu_span)
        speed = nodes.gpu_speed[r]
    else:
        gpu_dw = np.zeros(rows.shape[0])
        speed = nodes.speed[r]

    marginal = cpu_dw + gpu_dw
    base_runtime = pod.runtime_seconds if pod.runtime_seconds is not None else cfg.reference_runtime_seconds
    runtime = base_runtime / speed
    energy = marginal * runtime
    with np.errstate(invalid="ignore"):  # inf energy (a node short of GPUs) × 0 g/kWh
        carbon = energy / JOULES_PER_KWH * nodes.pue[r] * nodes.carbon_intensity[r]
    carbon = np.where(np.isinf(energy), np.inf, carbon)
    cost = energy if cfg.strategy == "energy" else carbon

    measured = nodes.measured_watts[r]
    # Power now: measured where there is a measurement, else the model; plus what the
    # predicted (not yet measured) pods add, plus this pod.
    now_watts = np.where(np.isnan(measured), p_measured + gpu_now, measured) + (p0 - p_measured)
    projected = now_watts + marginal
    cap = nodes.power_cap_watts[r]
    failed = np.zeros(rows.shape[0], dtype=bool)
    if cfg.power_cap_enabled:
        with np.errstate(invalid="ignore"):
            failed = fresh & ~np.isnan(cap) & (projected > cap * (1.0 - cfg.power_cap_headroom))

    eligible = fresh & ~failed & np.isfinite(cost)
    scores = normalise(cost, eligible, cfg.band)
    scores[~fresh] = cfg.neutral_score
    scores[failed] = 0
    return Evaluation(
        known=known,
        fresh=fresh,
        utilisation_before=np.where(known, u0, np.nan),
        utilisation_after=np.where(known, u1, np.nan),
        node_watts_before=np.where(known, p0 + gpu_now, np.nan),
        marginal_watts=np.where(known, marginal, np.nan),
        runtime_seconds=np.where(known, runtime, np.nan),
        energy_joules=np.where(known, energy, np.nan),
        carbon_grams=np.where(known, carbon, np.nan),
        cost=np.where(known, cost, np.nan),
        scores=scores,
        failed=failed,
        projected_watts=np.where(known, projected, np.nan),
    )


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
        energy_joules=nan,
        carbon_grams=nan,
        cost=nan,
        scores=np.full(n, cfg.neutral_score, dtype=np.int64),
        failed=false,
        projected_watts=nan,
    )
