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

from joulesched.policy.config import MAX_SCORE, PolicyConfig
from joulesched.policy.demand import PodDemand
from joulesched.policy.power import curve_power
from joulesched.policy.profile import NodeArrays
from joulesched.policy.units import JOULES_PER_KWH

# Reasons a node is not scored on its cost; the explain output and metrics use these words.
REASON_UNKNOWN = "no profile for this node"
REASON_STALE = "measurements older than max_age_seconds"
REASON_SATURATED = "CPU saturated: the pod would push the node past 100 % while another candidate has room"


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
    saturated: np.ndarray  # bool: scored 0 because the pod would saturate the node's CPU

    def reason(self, i: int, cfg: PolicyConfig) -> str:
        if not self.known[i]:
            return REASON_UNKNOWN
        if not self.fresh[i]:
            return REASON_STALE
        if self.failed[i]:
            return f"power cap: projected {self.projected_watts[i]:.0f} W would exceed the cap less {cfg.power_cap_headroom:.0%} headroom"
        return ""


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
    m = rows.shape[0]
    if len(nodes) == 0:
        return _all_unknown(m, cfg)
    known = rows >= 0
    all_known = bool(known.all())
    r = rows if all_known else np.where(known, rows, 0)
    t = nodes.table[r].T  # one gather for every per-node number; rows of t are columns
    (cores, u_measured, speed_cpu, pue, intensity, measured, cap, updated,
     gpu_count, gpu_idle, gpu_max, gpu_speed, gpu_util) = t
    curve = nodes.curve[r]
    with np.errstate(invalid="ignore"):  # NaN timestamps: static profiles are always fresh
        fresh = known & ~(now - updated > cfg.max_age_seconds)

    u0 = u_measured if predicted_cores is None else np.maximum(u_measured + predicted_cores / cores, 0.0)
    u1 = u0 + pod.cpu_cores / cores
    p_measured, p0, p1 = curve_power(curve, np.stack((u_measured, u0, u1)))
    cpu_dw = p1 - p0

    if pod.gpus > 0 or gpu_count.any():
        gpu_span = gpu_max - gpu_idle
        gpu_busy = gpu_util * gpu_count
        if predicted_gpus is not None:
            gpu_busy = gpu_busy + predicted_gpus * cfg.gpu_pod_utilisation
        gpu_now = gpu_count * gpu_idle + np.minimum(gpu_busy, gpu_count) * gpu_span
    else:
        gpu_span = gpu_busy = gpu_now = np.zeros(m)
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
    energy = marginal * runtime
    with np.errstate(invalid="ignore"):  # inf energy (a node short of GPUs) × 0 g/kWh
        carbon = energy * (pue * intensity / JOULES_PER_KWH)
    if pod.gpus > 0:
        carbon = np.where(np.isinf(energy), np.inf, carbon)
    cost = energy if cfg.strategy == "energy" else carbon

    # Power now: measured where there is a measurement, else the model; plus what the
    # predicted (not yet measured) pods add, plus this pod.
    now_watts = np.where(np.isnan(measured), p_measured + gpu_now, measured) + (p0 - p_measured)
    projected = now_watts + marginal
    if cfg.power_cap_enabled:
        with np.errstate(invalid="ignore"):  # NaN cap: uncapped, the comparison is False
            failed = fresh & (projected > cap * (1.0 - cfg.power_cap_headroom))
    else:
        failed = np.zeros(m, dtype=bool)

    eligible = fresh & ~failed & np.isfinite(cost)
    # Energy alone would fill a node past its cores: on a saturated node the work time-shares
    # at P(1)/c per core, which is cheaper than the steep middle of many real (non-convex)
    # curves. The pods there would run slower, so while another candidate has room a node the
    # pod would saturate scores 0 (it is not filtered: kube-scheduler may still need it).
    saturated = np.zeros(m, dtype=bool)
    if cfg.avoid_saturation and pod.cpu_cores > 0:
        over = eligible & (u1 > 1.0 + 1e-9)
        if over.any() and (eligible & ~over).any():
            saturated = over
            eligible = eligible & ~over
    scores = normalise(cost, eligible, cfg.band)
    scores[~fresh] = cfg.neutral_score
    scores[failed] = 0

    def masked(values: np.ndarray) -> np.ndarray:
        return values if all_known else np.where(known, values, np.nan)

    return Evaluation(
        known=known,
        fresh=fresh,
        utilisation_before=masked(u0),
        utilisation_after=masked(u1),
        node_watts_before=masked(p0 + gpu_now),
        marginal_watts=masked(marginal),
        runtime_seconds=masked(runtime),
        energy_joules=masked(energy),
        carbon_grams=masked(carbon),
        cost=masked(cost),
        scores=scores,
        failed=failed,
        projected_watts=masked(projected),
        saturated=saturated,
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
        saturated=false,
    )
