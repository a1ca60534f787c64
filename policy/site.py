"""The site (data-centre) model: PUE, WUE, grid carbon intensity over time, renewable share,
and the embodied emissions of the servers that stand in it.

One model for the extender (carbon intensity now), the agent (the site gauges it exports) and
the simulator (intensity over simulated time). Reading site files and CSV series is
``contracts/sitefile.py``'s job; everything here is a function of its arguments.

Carbon intensity (gCO2e/kWh) comes from a :class:`CarbonIntensitySource`: a tiny interface
(``name``, ``at(t)``, ``integral(a, b)``) with three mechanisms here —

- :class:`ConstantIntensity`: one number;
- :class:`IntensitySeries`: a step function (each value holds from its timestamp to the next,
  as hourly grid data is published), integrated exactly with a cumulative sum;
- :class:`WithFallback`: a primary source (e.g. a file a cron job refreshes, or a live API
  client) that may be unavailable, and the source that answers when it is. A source that
  cannot answer raises :class:`IntensityUnavailable`; the fallback answers instead, so a dead
  carbon API never stops scheduling or reporting (fail soft).

Carbon of an energy ``E`` spent evenly over ``[a, b]`` is ``E × ∫ I dt / (b − a)``: the series is
integrated over the interval, never replaced by a longer average. :meth:`interval_means` gives
that factor for many intervals at once.

Embodied emissions of a server (:class:`ServerEmbodied`) are amortised per hour of use over its
service life: ``embodied / (lifetime_years × 8760 h)``.

Errors (added to the tree in ``policy/__init__.py``)::

    PolicyError
    └── IntensityUnavailable   a carbon-intensity source cannot answer for a time (outside its
                               series, or a live source that failed); callers fall back
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from joulesched.policy.errors import PolicyError
from joulesched.policy.profile import Site

FloatArray = npt.NDArray[np.float64]

HOUR = 3600.0
HOURS_PER_YEAR = 8760.0  # amortisation convention (365 d); SCI and Cloud Carbon Footprint use it too
OUTSIDE_POLICIES = ("error", "hold", "wrap")


class IntensityUnavailable(PolicyError):
    """A carbon-intensity source has no value for the time asked (the caller falls back)."""


@runtime_checkable
class CarbonIntensitySource(Protocol):
    """Grid carbon intensity over time, gCO2e/kWh; times are unix seconds."""

    @property
    def name(self) -> str: ...

    def at(self, t: float) -> float:
        """Intensity in force at ``t``; raises :class:`IntensityUnavailable`."""
        ...

    def integral(self, a: float, b: float) -> float:
        """``∫ I dt`` over ``[a, b]`` in (gCO2e/kWh)·s; raises :class:`IntensityUnavailable`."""
        ...


@runtime_checkable
class HoldsSeries(Protocol):
    """A source whose answers come from a step series it holds now (a file it re-reads when the
    file changes): :func:`interval_means` integrates that series in one vectorised step."""

    def current_series(self) -> IntensitySeries:
        """The series now; raises :class:`IntensityUnavailable` when there is none."""
        ...


@dataclass(frozen=True)
class ConstantIntensity:
    value: float  # gCO2e/kWh
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or f"constant {self.value:g} g/kWh"

    def at(self, t: float) -> float:
        return self.value

    def integral(self, a: float, b: float) -> float:
        return self.value * (b - a) if b > a else 0.0


@dataclass(frozen=True)
class NoIntensity:
    """A site whose file gives no carbon intensity: unknown, never 0 g/kWh (which would make it
    the cleanest site); every read raises :class:`IntensityUnavailable`, as a source with no
    value for the time does, and the caller's fallback for that applies."""

    @property
    def name(self) -> str:
        return "no carbon intensity given"

    def at(self, t: float) -> float:
        raise IntensityUnavailable("no carbon_intensity, carbon_series or carbon_api given for the site")

    def integral(self, a: float, b: float) -> float:
        return self.at(a)


@dataclass(frozen=True)
class IntensitySeries:
    """A step function: ``values[k]`` holds on ``[starts[k], starts[k+1])``, the last until ``end``.

    ``outside`` says what happens before ``starts[0]`` or from ``end`` on: ``error`` (raise
    :class:`IntensityUnavailable`: the caller falls back), ``hold`` (the first / last value
    continues) or ``wrap`` (the series repeats with period ``end − starts[0]``: a year of hourly
    data replayed in a simulation). ``filled`` counts values that the reader filled in (empty
    hours); it is carried for reports, not used in the maths.
    """

    starts: FloatArray
    values: FloatArray
    end: float
    outside: str = "error"
    label: str = ""
    filled: int = 0
    _cum: FloatArray = field(init=False, repr=False, compare=False)
    # The same numbers as Python lists, for the scalar integral (no array per call).
    _scalars: tuple[list[float], list[float], list[float]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        starts = np.asarray(self.starts, dtype=np.float64)
        values = np.asarray(self.values, dtype=np.float64)
        if starts.ndim != 1 or starts.shape != values.shape or len(starts) == 0:
            raise ValueError("IntensitySeries: starts and values must be 1-D, non-empty and of equal length")
        if not (np.all(np.isfinite(starts)) and np.all(np.isfinite(values)) and np.isfinite(self.end)):
            raise ValueError("IntensitySeries: starts, values and end must be finite")
        if np.any(np.diff(starts) <= 0) or not self.end > starts[-1]:
            raise ValueError("IntensitySeries: starts must increase strictly and end must follow the last start")
        if np.any(values < 0):
            raise ValueError("IntensitySeries: intensities must be >= 0")
        if self.outside not in OUTSIDE_POLICIES:
            raise ValueError(
                f"IntensitySeries: outside must be one of {', '.join(OUTSIDE_POLICIES)}, got {self.outside!r}"
            )
        starts.setflags(write=False)
        values.setflags(write=False)
        widths = np.diff(np.append(starts, self.end))
        cum = np.concatenate(([0.0], np.cumsum(values * widths)))
        cum.setflags(write=False)
        object.__setattr__(self, "starts", starts)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "_cum", cum)
        object.__setattr__(self, "_scalars", (starts.tolist(), values.tolist(), cum.tolist()))

    @classmethod
    def regular(
        cls, origin: float, step: float, values: FloatArray | list[float], *, outside: str = "error", label: str = ""
    ) -> IntensitySeries:
        """Evenly spaced values (an hourly series: ``step=3600``) from ``origin``."""
        vals = np.asarray(values, dtype=np.float64)
        starts = origin + step * np.arange(len(vals), dtype=np.float64)
        return cls(starts, vals, origin + step * len(vals), outside, label)

    @property
    def name(self) -> str:
        return self.label or f"series of {len(self.values)} values"

    @property
    def period(self) -> float:
        return float(self.end - self.starts[0])

    def _primitive(self, x: FloatArray) -> FloatArray:
        """``∫ I dt`` from ``starts[0]`` to each ``x`` (any real x under hold/wrap)."""
        s0, end = float(self.starts[0]), self.end
        total = float(self._cum[-1])
        if self.outside == "wrap":
            periods = np.floor((x - s0) / self.period)
            inside = x - periods * self.period
            return periods * total + self._inside(inside)
        if self.outside == "error":
            bad = (x < s0) | (x > end)
            if np.any(bad):
                t = float(x[np.argmax(bad)])
                raise IntensityUnavailable(
                    f"carbon intensity {self.name}: no value at {t:.0f} (series covers {s0:.0f} to {end:.0f}); "
                    "extend the series, set outside: hold or wrap, or give a fallback"
                )
            return self._inside(x)
        before = np.minimum(x - s0, 0.0) * float(self.values[0])
        after = np.maximum(x - end, 0.0) * float(self.values[-1])
        return before + self._inside(np.clip(x, s0, end)) + after

    def _inside(self, x: FloatArray) -> FloatArray:
        k = np.clip(np.searchsorted(self.starts, x, side="right") - 1, 0, len(self.values) - 1)
        result: FloatArray = self._cum[k] + self.values[k] * (x - self.starts[k])
        return result

    def at(self, t: float) -> float:
        x = float(t)
        s0, end = float(self.starts[0]), self.end
        if self.outside == "wrap":
            x = s0 + (x - s0) % self.period
        elif x < s0 or x >= end:
            if self.outside == "error":
                raise IntensityUnavailable(
                    f"carbon intensity {self.name}: no value at {x:.0f} (series covers {s0:.0f} to {end:.0f}); "
                    "extend the series, set outside: hold or wrap, or give a fallback"
                )
            return float(self.values[0] if x < s0 else self.values[-1])
        k = int(np.searchsorted(self.starts, x, side="right")) - 1
        return float(self.values[max(k, 0)])

    def integral(self, a: float, b: float) -> float:
        if b <= a:
            return 0.0
        if math.isfinite(a) and math.isfinite(b):  # the scalar twin of _primitive: same operations, same bits
            start = self._primitive_scalar(float(a))
            return self._primitive_scalar(float(b)) - start
        ends = self._primitive(np.array([a, b], dtype=np.float64))
        return float(ends[1] - ends[0])

    def _primitive_scalar(self, x: float) -> float:
        """:meth:`_primitive` of one finite ``x``, operation for operation in Python floats (a
        simulation integrates one interval per event, where building arrays would dominate)."""
        starts, values, cum = self._scalars
        s0, end = starts[0], self.end
        if self.outside == "wrap":
            period = self.period
            periods = float(math.floor((x - s0) / period))
            return periods * cum[-1] + self._inside_scalar(x - periods * period)
        if self.outside == "error":
            if x < s0 or x > end:
                raise IntensityUnavailable(
                    f"carbon intensity {self.name}: no value at {x:.0f} (series covers {s0:.0f} to {end:.0f}); "
                    "extend the series, set outside: hold or wrap, or give a fallback"
                )
            return self._inside_scalar(x)
        before = min(x - s0, 0.0) * values[0]
        after = max(x - end, 0.0) * values[-1]
        return before + self._inside_scalar(min(max(x, s0), end)) + after

    def _inside_scalar(self, x: float) -> float:
        starts, values, cum = self._scalars
        k = min(max(bisect_right(starts, x) - 1, 0), len(values) - 1)
        return cum[k] + values[k] * (x - starts[k])

    def integrals(self, starts: FloatArray, ends: FloatArray) -> FloatArray:
        """``∫ I dt`` over many intervals at once (vectorised :meth:`integral`)."""
        a = np.asarray(starts, dtype=np.float64)
        b = np.maximum(np.asarray(ends, dtype=np.float64), a)
        result: FloatArray = self._primitive(b) - self._primitive(a)
        return result


@dataclass(frozen=True)
class WithFallback:
    """``primary`` when it can answer, else ``fallback`` (fail soft).

    Stateless: the caller counts fallbacks (the agent exports them) by calling
    :meth:`answered_by`.
    """

    primary: CarbonIntensitySource
    fallback: CarbonIntensitySource

    @property
    def name(self) -> str:
        return f"{self.primary.name} (fallback: {self.fallback.name})"

    def at(self, t: float) -> float:
        try:
            return self.primary.at(t)
        except IntensityUnavailable:
            return self.fallback.at(t)

    def integral(self, a: float, b: float) -> float:
        try:
            return self.primary.integral(a, b)
        except IntensityUnavailable:
            return self.fallback.integral(a, b)

    def answered_by(self, t: float) -> str:
        """The name of the source that answers at ``t`` (for logs and the ``fallback`` metric)."""
        try:
            self.primary.at(t)
        except IntensityUnavailable:
            return self.fallback.name
        return self.primary.name


def interval_means(source: CarbonIntensitySource, starts: FloatArray, ends: FloatArray) -> FloatArray:
    """The mean intensity over each interval ``[starts[i], ends[i]]`` — ``∫ I dt / (b − a)``.

    This is the factor by which an energy spent evenly over an interval turns into carbon; for a
    zero-length interval it is the intensity at that instant.
    """
    a = np.asarray(starts, dtype=np.float64)
    b = np.asarray(ends, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError("interval_means: starts and ends must have the same shape")
    width = b - a
    if isinstance(source, HoldsSeries):
        source = source.current_series()
    if isinstance(source, IntensitySeries):
        integral = source.integrals(a, b)
    elif isinstance(source, ConstantIntensity):
        return np.full(a.shape, source.value, dtype=np.float64)
    else:
        integral = np.array([source.integral(float(x), float(y)) for x, y in zip(a.ravel(), b.ravel(), strict=True)])
        integral = integral.reshape(a.shape)
    out = np.empty(a.shape, dtype=np.float64)
    positive = width > 0
    out[positive] = integral[positive] / width[positive]
    for idx in zip(*np.nonzero(~positive), strict=True):
        out[idx] = source.at(float(a[idx]))
    return out


@dataclass(frozen=True)
class Location:
    latitude: float
    longitude: float


@dataclass(frozen=True)
class SiteModel:
    """A data-centre site.

    ``wue`` is litres of water per kWh of IT energy — The Green Grid's definition (annual site
    water ÷ IT equipment energy; ISO/IEC 30134-9), the figure providers publish.
    ``renewable_share`` (0..1) is the renewable part of the site's electricity; operational
    carbon stays location-based (grid intensity), the share is reported beside it.
    ``facility_id`` and ``rack_ids`` link the site to its NADIKI registrations.
    """

    name: str
    pue: float = 1.0
    wue: float = 0.0
    renewable_share: float = 0.0
    carbon: CarbonIntensitySource = field(default_factory=lambda: ConstantIntensity(0.0))
    location: Location | None = None
    country_code: str = ""
    facility_id: str = ""
    rack_ids: tuple[str, ...] = ()
    description: str = ""

    def profile_site(self, t: float) -> Site:
        """The site as the extender's profile documents carry it, with the intensity in force at ``t``."""
        return Site(self.name, self.pue, self.carbon.at(t), self.wue, self.renewable_share)


@dataclass(frozen=True)
class ServerEmbodied:
    """Embodied emissions of one physical server (manufacture, transport, end of life)."""

    embodied_kg: float  # kgCO2e over the server's life
    lifetime_years: float  # service life the emissions are amortised over

    @property
    def lifetime_seconds(self) -> float:
        return self.lifetime_years * HOURS_PER_YEAR * HOUR

    @property
    def grams_per_hour(self) -> float:
        """Amortised emissions per hour of use."""
        return self.embodied_kg * 1000.0 / (self.lifetime_years * HOURS_PER_YEAR)

    @property
    def grams_per_second(self) -> float:
        return self.grams_per_hour / HOUR


@dataclass(frozen=True)
class SiteCatalogue:
    """Every site, and the embodied emissions of servers by server id (``default`` for the rest)."""

    sites: Mapping[str, SiteModel] = field(default_factory=dict)
    servers: Mapping[str, ServerEmbodied] = field(default_factory=dict)
    default_server: ServerEmbodied | None = None

    def embodied(self, server_id: str) -> ServerEmbodied | None:
        return self.servers.get(server_id, self.default_server)

    def site_of_facility(self, facility_id: str) -> SiteModel | None:
        """The site registered in NADIKI as ``facility_id`` (what a server registration names)."""
        for site in self.sites.values():
            if site.facility_id and site.facility_id == facility_id:
                return site
        return None

    def site_of_rack(self, rack_id: str) -> SiteModel | None:
        for site in self.sites.values():
            if rack_id in site.rack_ids:
                return site
        return None
