"""Carbon-aware deferral in the simulator: deferrable work is held, not submitted to the
scheduler, until :func:`policy.deferral.decide` — the deferrer's own rule — releases it.

The unit held is a **workflow run** (every pod with the same ``workflow``), or an independent
pod: a workflow is released whole, its first tasks entering the queue at the decided time (each
root shifted by the same delay, so a trace's own spacing of its roots is kept), the rest as
their parents finish, as in an undeferred run. A unit is deferrable when its pods carry a
``max_delay`` (the pod CSV column, or ``joulesched sim run --deadline`` for every workflow): it
must be done ``max_delay`` seconds after it was submitted (the first root's arrival).

Its expected runtime — what ``decide`` keeps between the latest start and the deadline — is
its makespan in the trace (the longest chain of task durations from its submission), taken at
the speed of the cluster's slowest node (the deferrer cannot know where it will run) plus the
autoscaler's scale-up delay when one is on (its nodes may have been powered off meanwhile),
with ``margin`` (25 %) of head-room on top, as a user sets an expected-runtime annotation:
released at its latest start, a workflow still queues behind others released at the same
clean hour. Whether that suffices is measured, never assumed: every unit that finishes after
its deadline is counted (``deadlines_missed``), and ``joulesched sim run`` fails when any does.

The decision is evaluated when the unit is submitted, then at every ``tick`` of simulated time
(15 min by default), at the start the last decision planned and at the latest start, so the
rule's "never later than the deadline minus the runtime" holds exactly. At each evaluation the
forecast is issued afresh (:func:`policy.forecast.issue`) from every site's series, and the
intensity a unit sees is the pointwise lowest of the cluster's sites
(:class:`policy.deferral.LowestOf`): carbon placement then sends it to the clean site. A
realistic forecast never sees the series after the evaluation time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from joulesched.policy.deferral import DEFAULT_STEP, DEFAULT_TOLERANCE, REASONS, Decision, Deferral, LowestOf, decide
from joulesched.policy.forecast import DEFAULT_HORIZON, FORECASTS, issue
from joulesched.policy.site import CarbonIntensitySource, IntensitySeries, IntensityUnavailable
from joulesched.sim.cluster import ClusterSpec
from joulesched.sim.errors import SimError
from joulesched.sim.model import PodSpec, topological_order

DEFAULT_TICK = 900.0  # s: the deferrer's re-evaluation period
DEADLINE_SLACK = 1e-6  # s: float noise on a finish exactly at the deadline
DEFAULT_MARGIN = 0.25  # head-room on the expected runtime (a fraction of it)


@dataclass(frozen=True)
class Deferring:
    """How a policy defers: the forecast it plans with and the rule's knobs."""

    forecast: str = "perfect"
    tick: float = DEFAULT_TICK
    step: float = DEFAULT_STEP
    tolerance: float = DEFAULT_TOLERANCE
    horizon: float = DEFAULT_HORIZON
    margin: float = DEFAULT_MARGIN

    def __post_init__(self) -> None:
        if self.forecast not in FORECASTS:
            raise SimError(f"--forecast: must be one of {', '.join(FORECASTS)}, got {self.forecast!r}")
        if not (self.tick > 0 and math.isfinite(self.tick)):
            raise SimError(f"deferral tick: must be a positive number of seconds, got {self.tick!r}")
        if not (self.margin >= 0 and math.isfinite(self.margin)):
            raise SimError(f"deferral margin: must be a fraction >= 0, got {self.margin!r}")


@dataclass(frozen=True)
class Unit:
    """One deferrable unit: a workflow run or an independent pod."""

    name: str
    pods: tuple[int, ...]
    roots: tuple[int, ...]
    terms: Deferral


def _slowest(cluster: ClusterSpec, gpu: bool) -> float:
    speeds = [t.gpus.speed if gpu else t.speed for t in cluster.node_types if not gpu or t.gpus.count]
    return min(speeds) if speeds else 1.0


def units_of(pods: Sequence[PodSpec], cluster: ClusterSpec, margin: float = DEFAULT_MARGIN) -> list[Unit]:
    """Every deferrable unit of ``pods`` (global indices), in submission order: a workflow run,
    or pods without one joined by their parent links (an independent pod alone). A unit's roots
    are its pods with no parent in it."""
    top = list(range(len(pods)))  # union-find over the parent links of pods without a workflow

    def find(i: int) -> int:
        while top[i] != i:
            top[i] = top[top[i]]
            i = top[i]
        return i

    for i, p in enumerate(pods):
        if not p.workflow:
            for j in p.parents:
                if not pods[j].workflow:
                    top[find(i)] = find(j)
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(pods):
        groups.setdefault(p.workflow or f"\0pod {find(i)}", []).append(i)
    order = topological_order(pods)
    if order is None:  # the readers refuse cycles; a hand-built workload may not
        raise SimError("deferral: the pods' parent links form a cycle")
    rank = {i: k for k, i in enumerate(order)}
    cpu_speed, gpu_speed = _slowest(cluster, False), _slowest(cluster, True)
    boot = cluster.autoscaler.scale_up_delay_seconds if cluster.autoscaler.enabled else 0.0
    units = []
    for name, members in groups.items():
        delays = [d for d in (pods[i].max_delay for i in members) if d is not None]
        if not delays:
            continue
        inside = set(members)
        roots = tuple(i for i in members if not inside.intersection(pods[i].parents))
        submitted = min(pods[i].arrival for i in roots)
        finish: dict[int, float] = {}
        for i in sorted(members, key=rank.__getitem__):
            p = pods[i]
            ready = max((finish[j] for j in p.parents if j in finish), default=p.arrival)
            finish[i] = ready + p.duration / (gpu_speed if p.gpu_request else cpu_speed)
        runtime = (max(finish.values()) - submitted + boot) * (1.0 + margin)
        label = name if not name.startswith("\0") else pods[members[0]].name
        units.append(Unit(label, tuple(members), roots, Deferral(submitted, submitted + min(delays), runtime)))
    units.sort(key=lambda u: (u.terms.submitted, u.name))
    return units


class Deferrer:
    """Issues the forecast at an evaluation time (once per time) and decides for a unit."""

    def __init__(self, cluster: ClusterSpec, how: Deferring) -> None:
        self.how = how
        self.sources: list[CarbonIntensitySource] = [s.carbon.source for s in cluster.sites.values()]
        self._at: float = math.nan
        self._forecast: CarbonIntensitySource | None = None
        self.forecasts_issued = 0

    def forecast(self, t: float) -> CarbonIntensitySource | None:
        if t == self._at:
            return self._forecast
        issued: list[CarbonIntensitySource] = []
        for source in self.sources:
            try:
                issued.append(issue(source, t, self.how.forecast, self.how.horizon))
            except IntensityUnavailable:
                continue
        if not issued:
            combined: CarbonIntensitySource | None = None
        elif len(issued) == 1:
            combined = issued[0]
        else:
            ends = [f.end for f in issued if isinstance(f, IntensitySeries)]
            combined = LowestOf(tuple(issued)).as_series(t, max(ends) if ends else t + self.how.horizon)
        self._at, self._forecast = t, combined
        self.forecasts_issued += 1
        return combined

    def decide(self, unit: Unit, t: float) -> Decision:
        return decide(unit.terms, t, self.forecast(t), step=self.how.step, tolerance=self.how.tolerance)

    def next_look(self, unit: Unit, t: float, decision: Decision) -> float:
        """When to evaluate a held unit again: the next tick, its planned start or its latest start."""
        tick = (math.floor(t / self.how.tick) + 1) * self.how.tick
        return min(tick, decision.planned_start, unit.terms.latest_start)


@dataclass
class DeferralOutcome:
    """Per unit: its terms, when it was released and why, when its last pod finished."""

    forecast: str
    names: list[str]
    submitted: np.ndarray
    deadline: np.ndarray
    runtime: np.ndarray
    released: np.ndarray  # NaN: never released (the run ended first)
    finished: np.ndarray  # NaN: some pod never ran
    reasons: list[str] = field(default_factory=list)
    evaluations: int = 0
    forecasts_issued: int = 0

    @property
    def missed(self) -> np.ndarray:
        """Units not done by their deadline (a unit that never finished counts as missed)."""
        return ~(self.finished <= self.deadline + DEADLINE_SLACK)

    def metrics(self) -> dict[str, object]:
        delay = self.released - self.submitted
        done = delay[np.isfinite(delay)]
        held = done > 0
        missed = self.missed
        return {
            "forecast": self.forecast,
            "units": len(self.names),
            "held_units": int(np.count_nonzero(held)),
            "released_by_reason": {r: self.reasons.count(r) for r in REASONS if r != "hold"},
            "deadlines_missed": int(np.count_nonzero(missed)),
            "missed_units": [n for n, m in zip(self.names, missed.tolist(), strict=True) if m][:20],
            "extra_pending_mean_seconds": float(done.mean()) if len(done) else 0.0,
            "extra_pending_p95_seconds": float(np.percentile(done, 95)) if len(done) else 0.0,
            "extra_pending_max_seconds": float(done.max()) if len(done) else 0.0,
            "slack_min_seconds": float(np.nanmin(self.deadline - self.finished)) if len(done) else None,
            "evaluations": self.evaluations,
            "forecasts_issued": self.forecasts_issued,
        }
