"""How efficient a node type is, and the autoscaler priorities that follow from it.

One figure per node type, shared by ``joulesched expander`` (the cluster-autoscaler
priority-expander ConfigMap) and the simulator's ``priority`` expander, so that the
autoscaler powers up the node types the scheduling policy prefers.

**CPU node types.** The figure is SPECpower_ssj2008's overall efficiency, inverted: the power
summed over the 11 measured levels (active idle, 10 %, ..., 100 %) divided by the work summed
over the ten loaded levels::

    J/work = Σ_{k=0..10} P(k/10)  /  Σ_{k=1..10} (k/10 × cores × speed)

in joules per unit of work, one unit being one reference core (``speed`` 1) busy for one
second. As in SPECpower, active idle adds power and no work, so a node type with a high idle
draw pays for it. Worked example, the EPYC 7763 curve of ``extender/data/example-nodes.yaml``
(``[56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268]``, 64 cores, speed 1): the powers
sum to 1858.8 W, the work to 5.5 × 64 = 352 core-units, so 1858.8 / 352 = 5.281 J per unit.

**GPU node types** (``gpu_count`` > 0) are ranked for GPU work, by the same ratio over one GPU's
linear board power ``idle + u × (max − idle)`` and its work ``u × gpu_speed``::

    J/GPU-work = Σ_{k=0..10} (idle + k/10 × (max − idle))  /  Σ_{k=1..10} (k/10 × gpu_speed)
               = (11 × idle + 5.5 × (max − idle)) / (5.5 × gpu_speed)

(host CPU power is left out: a GPU pod's CPU share is small and alike across GPU nodes).
CPU work and GPU work are not comparable, so every GPU node type ranks *below* every CPU-only
type: a CPU pod, which fits both, powers up a CPU node first; a GPU pod fits only GPU node
types, among which the GPU figure decides.

**Strategies.** ``energy`` ranks by the figure above (IT energy, as the scoring policy's
``energy`` strategy); ``carbon`` multiplies it by the site's PUE and grid intensity
(``J × PUE × gCO2e/kWh / 3.6e6``: grams CO2e per unit of work).

**Priorities.** Node types are sorted by (GPU or not, figure, name); a type whose figure is
within ``tolerance`` (1 %) of the first of the current tier joins that tier. Tier ``k`` of
``T`` gets priority ``step × (T − k)`` (the most efficient the highest, as cluster-autoscaler's
priority expander wants), so equal figures share a priority and the result is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median

from joulesched.policy.profile import CURVE_POINTS, NodeProfile
from joulesched.policy.units import JOULES_PER_KWH

STRATEGIES = ("energy", "carbon")
TOLERANCE = 0.01  # figures within 1 % are equal
PRIORITY_STEP = 10  # room for hand-written priorities between ours
LOADS = tuple(k / (CURVE_POINTS - 1) for k in range(CURVE_POINTS))  # 0, 0.1, ..., 1.0


@dataclass(frozen=True, order=True)
class Efficiency:
    """What a node type costs per unit of work; lower is better. Orders GPU types last."""

    gpu: bool  # ranked for GPU work (below every CPU-only type)
    cost: float  # joules (energy) or grams CO2e (carbon) per unit of work


def cpu_joules_per_work(curve: Sequence[float], cores: float, speed: float = 1.0) -> float:
    """SPECpower-style overall figure: Σ P(u_k) over 11 levels / Σ u_k × cores × speed."""
    if len(curve) != CURVE_POINTS:
        raise ValueError(f"a power curve has {CURVE_POINTS} points, got {len(curve)}")
    if cores <= 0 or speed <= 0:
        raise ValueError(f"cores and speed must be > 0, got cores={cores}, speed={speed}")
    return float(sum(curve)) / (sum(LOADS) * cores * speed)


def cpu_dynamic_joules_per_work(curve: Sequence[float], cores: float, speed: float = 1.0) -> float:
    """The same figure with idle power taken out: Σ (P(u_k) − P(0)) / Σ u_k × cores × speed.

    What a unit of work costs on a node that is on anyway (an always-on cluster, where idle
    power is spent whatever the placement): the simulator's cheapest-first reference ranks
    nodes by it (``sim/bound.py``).
    """
    idle = float(curve[0]) if len(curve) else 0.0
    return cpu_joules_per_work([float(w) - idle for w in curve], cores, speed)


def gpu_joules_per_work(idle_watts: float, max_watts: float, speed: float = 1.0) -> float:
    """The same figure for one GPU with linear board power idle + u × (max − idle)."""
    if speed <= 0:
        raise ValueError(f"gpu speed must be > 0, got {speed}")
    watts = sum(idle_watts + u * (max_watts - idle_watts) for u in LOADS)
    return watts / (sum(LOADS) * speed)


def efficiency(
    curve: Sequence[float],
    cores: float,
    speed: float = 1.0,
    *,
    gpu_count: int = 0,
    gpu_idle_watts: float = 0.0,
    gpu_max_watts: float = 0.0,
    gpu_speed: float = 1.0,
    pue: float = 1.0,
    carbon_intensity: float = 0.0,
    strategy: str = "energy",
) -> Efficiency:
    """The figure of one node type (see the module docstring)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    gpu = gpu_count > 0
    joules = gpu_joules_per_work(gpu_idle_watts, gpu_max_watts, gpu_speed) if gpu else cpu_joules_per_work(curve, cores, speed)
    cost = joules * pue * carbon_intensity / JOULES_PER_KWH if strategy == "carbon" else joules
    return Efficiency(gpu, cost)


def profile_efficiency(profile: NodeProfile, strategy: str = "energy") -> Efficiency:
    g = profile.gpus
    return efficiency(
        profile.power_curve_watts,
        profile.cores,
        profile.speed,
        gpu_count=g.count if g else 0,
        gpu_idle_watts=g.idle_watts if g else 0.0,
        gpu_max_watts=g.max_watts if g else 0.0,
        gpu_speed=g.speed if g else 1.0,
        pue=profile.pue,
        carbon_intensity=profile.carbon_intensity,
        strategy=strategy,
    )


def group_efficiency(members: Sequence[Efficiency]) -> Efficiency:
    """One figure for a node group from its nodes' figures: the median (one odd fit moves it little).

    A group with any GPU node is a GPU group, ranked on its GPU nodes' figures.
    """
    if not members:
        raise ValueError("a node group needs at least one profiled node")
    gpu = any(m.gpu for m in members)
    known = [m.cost for m in members if m.gpu == gpu and math.isfinite(m.cost)]
    return Efficiency(gpu, float(median(known)) if known else math.nan)  # NaN: no member's cost known


def tiers(figures: Mapping[str, Efficiency], tolerance: float = TOLERANCE) -> list[list[str]]:
    """Names grouped into tiers of equal efficiency, best tier first, names sorted within; those
    whose cost is unknown (NaN: a site without carbon data) in one tier after every other."""
    ordered = sorted(figures, key=lambda name: (not math.isfinite(figures[name].cost), figures[name], name))
    out: list[list[str]] = []
    head: Efficiency | None = None
    for name in ordered:
        e = figures[name]
        unknown = not math.isfinite(e.cost)
        if head is not None and unknown and not math.isfinite(head.cost):
            out[-1].append(name)
            continue
        if head is not None and not unknown and e.gpu == head.gpu and e.cost <= head.cost * (1 + tolerance):
            out[-1].append(name)
            continue
        out.append([name])
        head = e
    return out


def priorities(
    figures: Mapping[str, Efficiency], tolerance: float = TOLERANCE, step: int = PRIORITY_STEP
) -> dict[int, list[str]]:
    """cluster-autoscaler priorities: ``{priority: [names]}``, the most efficient the highest."""
    ranked = tiers(figures, tolerance)
    return {step * (len(ranked) - k): names for k, names in enumerate(ranked)}
