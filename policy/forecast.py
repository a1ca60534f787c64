"""The intensity forecast a deferrer has at an issue time, built from a recorded series.

What :func:`policy.deferral.decide` is given in a simulation: with a ``perfect`` forecast the
series itself, with a realistic one only what was known when it was issued. Three methods, each
an hourly (the series' own step) :class:`policy.site.IntensitySeries` from the step in force at
the issue time ``t0`` over ``horizon`` seconds:

* ``perfect``: the series' own values — what a deferrer that knew the future would plan with;
* ``persistence``: each future hour takes the value of the same hour on the last day already
  known (``t − 24 h``, or ``t − 48 h`` for the second day ahead, …);
* ``day-ahead``: each future hour takes the mean of the same hour over the 7 last days already
  known (a simple seasonal-naive average; hours the series cannot give are left out of it).

The step in force at ``t0`` (it began at or before ``t0``) is known in every method: a live
source reports the current intensity. Nothing that begins after ``t0`` is ever read by a
realistic method (the tests change the series after ``t0`` and see the same forecast). A
forecast ends at the first hour it cannot give (a series with ``outside: error`` and too little
history); when it cannot give the hour in force at ``t0`` it raises
:class:`policy.site.IntensityUnavailable`, and the deferrer releases (``no_forecast``).
"""

from __future__ import annotations

import math

import numpy as np

from joulesched.policy.errors import PolicyError
from joulesched.policy.site import (
    CarbonIntensitySource,
    ConstantIntensity,
    IntensitySeries,
    IntensityUnavailable,
    interval_means,
)

FORECASTS = ("perfect", "persistence", "day-ahead")
DAY = 86400.0
DEFAULT_HORIZON = 48 * 3600.0  # two days: past the longest deferral window worth planning
DAY_AHEAD_DAYS = 7


def series_step(series: IntensitySeries) -> float:
    """The series' one step in seconds; a forecast grid needs evenly spaced values."""
    if len(series.starts) == 1:
        return float(series.end - series.starts[0])
    widths = np.diff(np.append(series.starts, series.end))
    step = float(widths[0])
    if not np.allclose(widths, step, rtol=0.0, atol=1e-6):
        raise PolicyError(f"forecast: {series.name}: values must be evenly spaced (an hourly series), they are not")
    return step


def _values(series: IntensitySeries, cells: np.ndarray, step: float) -> np.ndarray:
    """The value of each grid cell (NaN where the series has none); cells lie on its own steps, so
    the mean over a cell is the value in force there."""
    try:
        return interval_means(series, cells, cells + step)
    except IntensityUnavailable:
        pass
    out = np.full(cells.shape, np.nan)
    for i, c in enumerate(cells.tolist()):
        try:
            out[i] = series.at(c)
        except IntensityUnavailable:
            continue
    return out


def issue(
    source: CarbonIntensitySource, issued: float, method: str, horizon: float = DEFAULT_HORIZON
) -> CarbonIntensitySource:
    """The forecast of ``source`` issued at ``issued`` by ``method`` (:data:`FORECASTS`)."""
    if method not in FORECASTS:
        raise PolicyError(f"forecast: method must be one of {', '.join(FORECASTS)}, got {method!r}")
    if not (horizon > 0 and math.isfinite(horizon)):
        raise PolicyError(f"forecast: horizon must be a positive number of seconds, got {horizon!r}")
    if not math.isfinite(issued):
        raise PolicyError(f"forecast: issue time must be finite, got {issued!r}")
    if isinstance(source, ConstantIntensity):
        return source  # every method forecasts a constant exactly
    if not isinstance(source, IntensitySeries):
        raise PolicyError(f"forecast: needs a recorded series or a constant, got {source.name}")
    step = series_step(source)
    s0 = float(source.starts[0])
    first = s0 + math.floor((issued - s0) / step) * step  # the step in force at the issue time
    cells = first + step * np.arange(math.ceil((issued + horizon - first) / step), dtype=np.float64)
    if method == "perfect":
        values = _values(source, cells, step)
    else:
        # Whole days from each cell back to the last day known (0 for the cell in force now).
        back = np.ceil((cells - first) / DAY)
        days = 1 if method == "persistence" else DAY_AHEAD_DAYS
        lookback = cells[None, :] - (back[None, :] + np.arange(days, dtype=np.float64)[:, None]) * DAY
        history = _values(source, lookback.ravel(), step).reshape(lookback.shape)
        known = np.isfinite(history)
        counts = known.sum(axis=0)
        with np.errstate(invalid="ignore"):
            values = np.where(counts > 0, np.where(known, history, 0.0).sum(axis=0) / np.maximum(counts, 1), np.nan)
        values[0] = _values(source, cells[:1], step)[0]
    missing = np.flatnonzero(~np.isfinite(values))
    keep = int(missing[0]) if len(missing) else len(cells)
    if keep == 0:
        raise IntensityUnavailable(f"forecast of {source.name} at {issued:.0f}: no value for the hour in force")
    label = f"{method} forecast of {source.name} issued at {issued:.0f}"
    return IntensitySeries(cells[:keep], values[:keep], float(cells[keep - 1] + step), "error", label)
