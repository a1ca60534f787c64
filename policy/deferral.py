"""Carbon-aware deferral: when to let a deferrable pod start.

A pod that opts in is held (by a scheduling gate, or in the simulator by not submitting it) and
released by :func:`decide`, one pure function of the pod's deferral terms, the time and an
intensity source (the forecast the caller has: the real series in a simulation with a perfect
forecast, a persistence or day-ahead forecast, or a live API's). The deferrer and the simulator
both call it; neither has its own rule.

The rule, for a pod submitted at ``submitted`` with expected runtime ``T`` and deadline ``D``:

* the **latest start** is ``D − T``; a pod is never released later than that. When ``now`` has
  reached it, or the caller's next decision would come after it (``next_decision``: a deferrer
  decides once a tick), the pod is released at once (``deadline``), and a pod whose deadline has
  already passed (or whose runtime does not fit before it) is released at once too (``expired``);
* the **plan** is the start ``s`` in ``[now, latest start]``, on a grid of ``step`` seconds from
  ``now`` (the latest start itself is always a candidate), whose run ``[s, s + T]`` has the
  lowest mean intensity ``∫ I dt / T`` under the forecast; ties go to the earliest start (means
  within ``TIE`` of each other, relative, are ties: a flat forecast's means differ in the last
  bits of their sums);
* the pod is released (``clean``) when starting now is within ``tolerance`` (a fraction) of the
  plan's mean intensity — i.e. now is in the cleanest part of its window — and held otherwise,
  to be decided again at the next tick (the forecast may have changed);
* candidates the forecast cannot cover (the run reaches past its horizon) are skipped; with no
  candidate left (no forecast at all, or none that covers a run starting now) the pod is released
  (``no_forecast``): deferral never delays work it cannot justify.

Pod terms come from annotations (:func:`deferral_from_pod`): ``joulesched.io/deadline`` (RFC 3339)
or ``joulesched.io/max-delay-seconds`` (from the pod's creation), and the runtime from
``joulesched.io/expected-runtime-seconds`` (the same annotation the scorer reads). A pod with a
deadline but no runtime is treated as runtime 0: it may start as late as its deadline. A
deadline more than ``MAX_DELAY_SECONDS`` after the pod's creation is refused as a delay is (a
typo for a year that far ahead would otherwise be a search over decades of candidates).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from joulesched.policy.demand import expected_runtime
from joulesched.policy.errors import PolicyError
from joulesched.policy.site import CarbonIntensitySource, IntensitySeries, IntensityUnavailable, interval_means

GATE = "joulesched.io/deferred"
DEADLINE_ANNOTATION = "joulesched.io/deadline"
MAX_DELAY_ANNOTATION = "joulesched.io/max-delay-seconds"
MAX_DELAY_SECONDS = 31 * 86400.0  # a month: past this a delay is a typo, not a plan

DEFAULT_STEP = 900.0  # 15 min: finer than any grid series' hourly step, cheap to search
DEFAULT_TOLERANCE = 0.02  # release when now is within 2 % of the cleanest start's mean intensity

REASONS = ("clean", "deadline", "expired", "no_forecast", "hold")
LOWEST_RESOLUTION = 300.0  # s: cells of the pointwise minimum (hourly and 5-minute grid data align to it)
TIE = 1e-9  # relative: means closer than this are equal


@dataclass(frozen=True)
class Deferral:
    """A deferrable pod's terms (unix seconds)."""

    submitted: float
    deadline: float
    runtime: float = 0.0

    def __post_init__(self) -> None:
        for name in ("submitted", "deadline", "runtime"):
            if not math.isfinite(getattr(self, name)):
                raise PolicyError(f"deferral: {name} must be finite, got {getattr(self, name)!r}")
        if self.runtime < 0:
            raise PolicyError(f"deferral: runtime must be >= 0, got {self.runtime!r}")

    @property
    def latest_start(self) -> float:
        return self.deadline - self.runtime


@dataclass(frozen=True)
class Decision:
    """What to do with a held pod now.

    ``release``: remove the gate now. ``reason``: one of :data:`REASONS`. ``planned_start``: the
    cleanest start under the forecast (``now`` when released). ``now_mean`` / ``planned_mean``:
    the forecast mean intensity (gCO2e/kWh) of a run starting now / at the plan (NaN when the
    forecast does not cover it) — their difference × the pod's energy is the estimated saving.
    """

    release: bool
    reason: str
    planned_start: float
    now_mean: float = math.nan
    planned_mean: float = math.nan


@dataclass(frozen=True)
class LowestOf:
    """The pointwise lowest intensity of several sites: what a pod that carbon placement may put
    at any of them will see. (A pod pinned to one site uses that site's source alone.)

    ``integral`` sums cells of ``resolution`` seconds aligned to multiples of it (absolute time):
    in each cell every source's mean is taken and the lowest kept, exact for step series whose
    steps fall on cell edges (hourly and 5-minute grid data), a lower bound otherwise. A source
    that cannot answer for a cell is skipped; when none can, :class:`IntensityUnavailable`.
    """

    sources: tuple[CarbonIntensitySource, ...]
    resolution: float = LOWEST_RESOLUTION

    def __post_init__(self) -> None:
        if not self.sources:
            raise PolicyError("LowestOf: needs at least one intensity source")
        if not (self.resolution > 0 and math.isfinite(self.resolution)):
            raise PolicyError(f"LowestOf: resolution must be a positive number of seconds, got {self.resolution!r}")

    @property
    def name(self) -> str:
        return "lowest of " + ", ".join(s.name for s in self.sources)

    def at(self, t: float) -> float:
        values = []
        for source in self.sources:
            try:
                values.append(source.at(t))
            except IntensityUnavailable:
                continue
        if not values:
            raise IntensityUnavailable(f"{self.name}: no source has a value at {t:.0f}")
        return min(values)

    def _cells(self, a: float, b: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The cells covering ``[a, b]`` (``lo``, ``hi``) and the lowest source mean in each."""
        r = self.resolution
        edges = np.arange(math.floor(a / r), math.ceil(b / r) + 1, dtype=np.float64) * r
        edges[0], edges[-1] = a, b
        edges = edges[np.concatenate(([True], np.diff(edges) > 0))]
        lo, hi = edges[:-1], edges[1:]
        best = np.full(lo.shape, np.inf)
        for source in self.sources:
            try:
                means = interval_means(source, lo, hi)
            except IntensityUnavailable:  # not every cell: those it has, one by one
                means = np.full(lo.shape, np.inf)
                for i in range(len(lo)):
                    try:
                        means[i] = interval_means(source, lo[i : i + 1], hi[i : i + 1])[0]
                    except IntensityUnavailable:
                        continue
            best = np.minimum(best, means)
        if not np.all(np.isfinite(best)):
            raise IntensityUnavailable(f"{self.name}: no source covers {a:.0f} to {b:.0f}")
        return lo, hi, best

    def integral(self, a: float, b: float) -> float:
        if b <= a:
            return 0.0
        lo, hi, best = self._cells(a, b)
        return float(np.sum(best * (hi - lo)))

    def as_series(self, a: float, b: float) -> IntensitySeries:
        """The same minimum over ``[a, b]`` as one step series (``outside: error``): equal to
        :meth:`integral` there, and integrated in one vectorised step, where a search over many
        candidate starts would otherwise recompute every cell for each of them."""
        if not b > a:
            raise PolicyError(f"LowestOf.as_series: the end must follow the start, got {a!r} to {b!r}")
        lo, _, best = self._cells(a, b)
        return IntensitySeries(lo, best, b, "error", self.name)


def mean_over_runs(forecast: CarbonIntensitySource, starts: np.ndarray, runtime: float) -> np.ndarray:
    """Forecast mean intensity of a run of ``runtime`` from each start; NaN where not covered."""
    try:
        return interval_means(forecast, starts, starts + runtime)
    except IntensityUnavailable:
        pass
    out = np.full(starts.shape, np.nan)  # part of the grid is past the horizon: keep what is covered
    for i in range(len(starts)):
        try:
            out[i] = interval_means(forecast, starts[i : i + 1], starts[i : i + 1] + runtime)[0]
        except IntensityUnavailable:
            continue
    return out


def candidate_starts(deferral: Deferral, now: float, step: float = DEFAULT_STEP) -> np.ndarray:
    """``now``, ``now + step``, … up to and including the latest start."""
    if step <= 0 or not math.isfinite(step):
        raise PolicyError(f"deferral: step must be a positive number of seconds, got {step!r}")
    latest = deferral.latest_start
    if latest <= now:
        return np.array([now])
    grid = now + step * np.arange(math.floor((latest - now) / step) + 1, dtype=np.float64)
    if grid[-1] < latest:
        grid = np.append(grid, latest)
    return grid


def decide(
    deferral: Deferral,
    now: float,
    forecast: CarbonIntensitySource | None,
    *,
    step: float = DEFAULT_STEP,
    tolerance: float = DEFAULT_TOLERANCE,
    next_decision: float | None = None,
) -> Decision:
    """Release or hold ``deferral`` at ``now`` under ``forecast`` (the module docstring's rule);
    ``next_decision``: when the caller decides next (None: at any time it needs)."""
    if not 0 <= tolerance < 1:
        raise PolicyError(f"deferral: tolerance must be in [0, 1), got {tolerance!r}")
    if deferral.latest_start < deferral.submitted or (now >= deferral.deadline and now > deferral.latest_start):
        return Decision(True, "expired", now)
    if now >= deferral.latest_start or (next_decision is not None and next_decision > deferral.latest_start):
        return Decision(True, "deadline", now)
    if forecast is None:
        return Decision(True, "no_forecast", now)
    starts = candidate_starts(deferral, now, step)
    means = mean_over_runs(forecast, starts, deferral.runtime)
    covered = np.isfinite(means)
    if not covered[0]:
        return Decision(True, "no_forecast", now)
    scored = np.where(covered, means, np.inf)
    best = int(np.argmax(scored <= scored.min() * (1.0 + TIE)))  # the earliest of the ties
    now_mean, best_mean = float(means[0]), float(means[best])
    if best == 0 or now_mean <= best_mean * (1.0 + tolerance) * (1.0 + TIE):
        return Decision(True, "clean", now, now_mean, best_mean)
    return Decision(False, "hold", float(starts[best]), now_mean, best_mean)


def _rfc3339(raw: str, where: str) -> float:
    text = raw.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        when = datetime.fromisoformat(text)
    except ValueError as err:
        raise PolicyError(f"{where}: must be an RFC 3339 time such as 2026-12-01T18:00:00Z, got {raw[:64]!r}") from err
    if when.tzinfo is None:
        raise PolicyError(f"{where}: must carry a time zone (Z or ±hh:mm), got {raw[:64]!r}")
    return when.timestamp()


def deferral_from_pod(pod: Mapping[str, Any], created: float) -> Deferral | None:
    """The pod's deferral terms from its annotations, or ``None`` when it does not opt in.

    ``created`` is the pod's creation time (unix seconds; ``metadata.creationTimestamp``), the
    origin of ``max-delay-seconds``. Both annotations present: the earlier deadline wins.
    Raises :class:`PolicyError` naming the annotation for a malformed value.
    """
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping):
        return None
    deadlines: list[float] = []
    raw = annotations.get(DEADLINE_ANNOTATION)
    if raw is not None:
        if not isinstance(raw, str):
            raise PolicyError(f"Pod annotation {DEADLINE_ANNOTATION}: must be a string, got {type(raw).__name__}")
        deadlines.append(_rfc3339(raw, f"Pod annotation {DEADLINE_ANNOTATION}"))
    raw = annotations.get(MAX_DELAY_ANNOTATION)
    if raw is not None:
        try:
            delay = float(raw)
        except (TypeError, ValueError) as err:
            raise PolicyError(
                f"Pod annotation {MAX_DELAY_ANNOTATION}: must be a number of seconds, got {str(raw)[:64]!r}"
            ) from err
        if not 0 <= delay <= MAX_DELAY_SECONDS:
            raise PolicyError(
                f"Pod annotation {MAX_DELAY_ANNOTATION}: must be between 0 and {MAX_DELAY_SECONDS:g} seconds, got {str(raw)[:64]!r}"
            )
        deadlines.append(created + delay)
    if not deadlines:
        return None
    if min(deadlines) - created > MAX_DELAY_SECONDS:  # only a deadline annotation can be that far
        raise PolicyError(
            f"Pod annotation {DEADLINE_ANNOTATION}: must be within {MAX_DELAY_SECONDS:g} seconds of the pod's "
            f"creation, got {str(annotations.get(DEADLINE_ANNOTATION))[:64]!r}"
        )
    runtime = expected_runtime(pod) or 0.0
    return Deferral(submitted=created, deadline=min(deadlines), runtime=runtime)
