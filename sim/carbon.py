"""Grid carbon intensity over simulated time: a constant, or an hourly series from a CSV file.

An hourly series (the US EIA-derived files of ``sim/data/carbon``: ``timestamp,...,avg_CI``)
holds one value per hour in gCO2e/kWh. Simulated time ``t`` (seconds) maps to the wall clock
``start + t``; before the series starts or after it ends the series repeats (it is one year).
Empty hours are handled as the site says: ``interpolate`` (linear between the nearest valid
hours, the default), ``previous`` (carry the last valid value) or ``error``; how many were
filled is kept in ``filled_hours`` and reported.

Carbon of a constant power ``P`` over ``[a, b]`` is ``P × ∫ CI dt`` — :meth:`integral` is exact
for the step function the series describes, so carbon is integrated, not multiplied by a
mean.
"""

from __future__ import annotations

import csv
import math
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from joulesched.sim.errors import ClusterError

HOUR = 3600.0
MISSING_POLICIES = ("interpolate", "previous", "error")


@dataclass(frozen=True)
class CarbonSeries:
    """Piecewise-constant intensity: ``values[k]`` holds from ``origin + k·step`` for ``step`` seconds."""

    values: np.ndarray  # gCO2e/kWh per step
    origin: float  # unix seconds of values[0]
    offset: float  # unix seconds of simulated t = 0
    step: float = HOUR
    source: str = ""
    filled_hours: int = 0
    _cum: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        cum = np.concatenate(([0.0], np.cumsum(self.values * self.step)))
        object.__setattr__(self, "_cum", cum)

    @classmethod
    def constant(cls, value: float, source: str = "constant") -> CarbonSeries:
        return cls(np.array([float(value)]), 0.0, 0.0, step=HOUR, source=source)

    @property
    def is_constant(self) -> bool:
        return len(self.values) == 1

    @property
    def period(self) -> float:
        return len(self.values) * self.step

    def mean(self) -> float:
        return float(np.mean(self.values))

    def _position(self, t: float) -> float:
        """Seconds into the series, wrapped to one period."""
        return (self.offset + t - self.origin) % self.period

    def step_index(self, t: float) -> int:
        """Which step holds at ``t`` (the value changes only when this does)."""
        if self.is_constant:
            return 0
        return int((self.offset + t - self.origin) // self.step)

    def at(self, t: float) -> float:
        if self.is_constant:
            return float(self.values[0])
        k = min(int(self._position(t) // self.step), len(self.values) - 1)
        return float(self.values[k])

    def _primitive(self, x: float) -> float:
        """∫ from the series origin to ``x`` seconds (``x`` may run past one period)."""
        periods, rest = divmod(x, self.period)
        k = min(int(rest // self.step), len(self.values) - 1)
        return periods * float(self._cum[-1]) + float(self._cum[k]) + float(self.values[k]) * (rest - k * self.step)

    def integral(self, a: float, b: float) -> float:
        """∫ CI dt over simulated ``[a, b]`` in (gCO2e/kWh)·s."""
        if b <= a:
            return 0.0
        if self.is_constant:
            return float(self.values[0]) * (b - a)
        x = self.offset + a - self.origin
        x0 = x % self.period
        return self._primitive(x0 + (b - a)) - self._primitive(x0)

    def boundaries(self, a: float, b: float) -> list[float]:
        """Simulated times in ``(a, b)`` where the intensity changes (for plots)."""
        if self.is_constant:
            return []
        first = math.floor((self.offset + a - self.origin) / self.step) + 1
        out = []
        k = first
        while True:
            t = self.origin + k * self.step - self.offset
            if t >= b:
                return out
            out.append(t)
            k += 1


def parse_start(value: str, where: str) -> float:
    """Unix seconds from an ISO 8601 time (``2022-06-01T00:00:00Z``); naive times are UTC."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as err:
        raise ClusterError(where, [f"start: {value!r} is not an ISO 8601 time like 2022-06-01T00:00:00Z"]) from err
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def read_hourly_csv(
    path: str | Path, column: str = "avg_CI", *, missing: str = "interpolate", offset: float = 0.0
) -> CarbonSeries:
    """Read an hourly series; ``ClusterError`` names the file, line and field of a problem."""
    path = str(path)
    if missing not in MISSING_POLICIES:
        raise ClusterError(path, [f"missing: must be one of {', '.join(MISSING_POLICIES)}, got {missing!r}"])
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            rows = list(csv.reader(fh))
    except OSError as err:
        raise ClusterError(path, [f"cannot read: {err.strerror or err}"]) from err
    if not rows:
        raise ClusterError(path, ["empty file (expected a header with timestamp and " + column + ")"])
    header = [h.strip() for h in rows[0]]
    for needed in ("timestamp", column):
        if needed not in header:
            raise ClusterError(path, [f"line 1: column {needed!r} is required (columns: {', '.join(header)})"])
    ti, ci = header.index("timestamp"), header.index(column)
    times: list[float] = []
    values: list[float] = []
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise ClusterError(path, [f"line {lineno}: has {len(row)} fields, the header has {len(header)}"])
        stamp = row[ti].strip()
        try:
            when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        except ValueError as err:
            raise ClusterError(path, [f"line {lineno}: field 'timestamp': {stamp!r} is not an ISO 8601 time"]) from err
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        t = when.timestamp()
        if times and abs(t - times[-1] - HOUR) > 1e-6:
            raise ClusterError(
                path, [f"line {lineno}: field 'timestamp': {stamp} is not one hour after the previous row"]
            )
        raw = row[ci].strip()
        if raw == "":
            value = math.nan
        else:
            try:
                value = float(raw)
            except ValueError as err:
                raise ClusterError(path, [f"line {lineno}: field {column!r}: {raw!r} is not a number"]) from err
            if not math.isfinite(value) or value < 0:
                raise ClusterError(
                    path, [f"line {lineno}: field {column!r}: must be a finite number >= 0, got {raw!r}"]
                )
        times.append(t)
        values.append(value)
    if not values:
        raise ClusterError(path, ["no data rows"])
    arr = np.array(values, dtype=float)
    gaps = np.flatnonzero(np.isnan(arr))
    if len(gaps) == len(arr):
        raise ClusterError(path, [f"field {column!r}: every hour is empty"])
    if len(gaps):
        if missing == "error":
            first = int(gaps[0])
            raise ClusterError(
                path,
                [
                    f"line {first + 2}: field {column!r}: empty ({len(gaps)} empty hours; set missing: interpolate or previous)"
                ],
            )
        valid = np.flatnonzero(~np.isnan(arr))
        if missing == "interpolate":
            arr[gaps] = np.interp(gaps, valid, arr[valid])
        else:
            for g in gaps:
                before = valid[: bisect_right(valid.tolist(), int(g))]
                arr[g] = arr[before[-1]] if len(before) else arr[valid[0]]
    return CarbonSeries(arr, times[0], offset, HOUR, path, len(gaps))
