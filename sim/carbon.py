"""Grid carbon intensity on the simulator's clock: :mod:`policy.site`'s sources, read by
:mod:`contracts.sitefile`; simulated time ``t`` is wall-clock time ``start + t``.

A site's intensity (gCO2e/kWh) is a constant (:class:`policy.site.ConstantIntensity`) or an
hourly series (the US EIA-derived files of ``sim/data/carbon``: ``timestamp,...,avg_CI``) read by
:func:`contracts.sitefile.read_intensity_csv` into a :class:`policy.site.IntensitySeries` that
repeats outside its year (``outside: wrap``). Empty hours are handled as the site says:
``interpolate`` (linear between the nearest valid hours, the default), ``previous`` (carry the
last valid value) or ``error``; how many were filled is kept in ``filled_hours`` and reported.

Carbon of a constant power ``P`` over ``[a, b]`` is ``P × ∫ CI dt`` — the series' integral is
exact for the step function it describes, so carbon is integrated, not multiplied by a mean.
The series is moved onto the simulated clock once (every start minus the cluster's start: whole
seconds, so exactly), and integrals are taken in simulated seconds, far smaller numbers than
unix times: an event's interval is not rounded to the 2·10⁻⁷ s steps of a unix time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from joulesched.contracts.errors import SeriesFileError
from joulesched.contracts.sitefile import MISSING_POLICIES, read_intensity_csv
from joulesched.policy.site import ConstantIntensity, IntensitySeries
from joulesched.sim.errors import ClusterError

HOUR = 3600.0

__all__ = ["HOUR", "MISSING_POLICIES", "SiteCarbon", "parse_start", "read_hourly_series"]


@dataclass(frozen=True)
class SiteCarbon:
    """A site's intensity source with its times in simulated seconds (``t = 0``: the cluster's start)."""

    source: ConstantIntensity | IntensitySeries

    @classmethod
    def constant(cls, value: float, label: str = "") -> SiteCarbon:
        return cls(ConstantIntensity(float(value), label))

    @property
    def name(self) -> str:
        """The file the series came from, or ``constant N g/kWh``."""
        return self.source.name

    @property
    def filled_hours(self) -> int:
        """Empty hours of the file that the reader filled in."""
        return self.source.filled if isinstance(self.source, IntensitySeries) else 0

    def mean(self) -> float:
        """The mean of the values (each hour of the year counted once)."""
        if isinstance(self.source, IntensitySeries):
            return float(np.mean(self.source.values))
        return self.source.value

    def at(self, t: float) -> float:
        return self.source.at(t)

    def integral(self, a: float, b: float) -> float:
        """``∫ CI dt`` over simulated ``[a, b]`` in (gCO2e/kWh)·s."""
        return self.source.integral(a, b)

    def step_index(self, t: float) -> int:
        """Which step of the (repeating) series holds at ``t``: the value changes only when this does."""
        series = self.source
        if not isinstance(series, IntensitySeries):
            return 0
        s0 = float(series.starts[0])
        periods = math.floor((t - s0) / series.period)
        inside = s0 + (t - s0) % series.period  # as IntensitySeries.at wraps it
        return periods * len(series.values) + int(np.searchsorted(series.starts, inside, side="right")) - 1


def parse_start(value: str, where: str) -> float:
    """Unix seconds from an ISO 8601 time (``2022-06-01T00:00:00Z``); naive times are UTC."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as err:
        raise ClusterError(where, [f"start: {value!r} is not an ISO 8601 time like 2022-06-01T00:00:00Z"]) from err
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def read_hourly_series(
    path: str | Path, column: str = "avg_CI", *, missing: str = "interpolate", offset: float = 0.0
) -> SiteCarbon:
    """Read an hourly series that repeats outside its year, on the simulated clock that starts at
    unix time ``offset``; ``ClusterError`` names the file, line and field of a problem."""
    try:
        series = read_intensity_csv(path, column, missing=missing, outside="wrap", step=HOUR)
    except SeriesFileError as err:
        raise ClusterError(str(path), err.problems) from err
    moved = IntensitySeries(
        series.starts - offset, series.values, series.end - offset, series.outside, series.label, series.filled
    )
    return SiteCarbon(moved)
