"""Environmental indicators of a workload, from attributed joules: pure, elementwise, hand-checkable.

Every function takes per-interval arrays (one entry per pod and interval, or any shape that
broadcasts) and returns arrays of the same shape; a NaN factor (a node with no known site, a
server with no embodied figure) gives a NaN indicator for that interval, which totals leave out
and count — the same as the Prometheus recording rules, where a missing factor makes the series
absent. ``deploy/prometheus/rules.yaml`` computes the same formulas in PromQL, and
``joulesched report`` computes them here; tests hold the two equal.

Per interval ``k`` of length ``Δt_k`` (a pod's energy increment ``E_k`` from its counter)::

    IT energy          E_k                         attributed CPU + DRAM + other + GPU energy,
                                                   including the idle share under idle_policy
                                                   "requests" (under "bucket" idle stays unattributed)
    facility energy    F_k = E_k × PUE_k
    operational CO2e   O_k = F_k / 3.6e6 × I_k     I_k: the grid intensity of interval k, gCO2e/kWh
                                                   (the series' mean over the interval — integrated,
                                                   never a longer average)
    water              W_k = E_k / 3.6e6 × WUE_k   WUE per IT kWh (The Green Grid, ISO/IEC 30134-9)
    renewable energy   R_k = F_k × share_k
    embodied CO2e      M_k = m × Δt_k × s_k        m: the server's amortised grams per second,
                                                   s_k: the pod's share of the server in interval k

The share ``s_k`` is the pod's part of the node's measured energy in the interval
(:func:`energy_share`) — so embodied emissions follow the idle policy exactly as energy does —
or, where no energy is measured (a simulation, a plan), its CPU requests over the node's
allocatable CPUs (:func:`requests_share`).

SCI (Green Software Foundation, ISO/IEC 21031): ``((E × I) + M) per R``; ``E × I`` is the
integrated operational carbon ``Σ O_k`` above, and R is a count of functional units
(:func:`functional_units`: requests, workflow runs or hours).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from joulesched.policy.units import JOULES_PER_KWH

FloatArray = npt.NDArray[np.float64]
ArrayLike = FloatArray | float

FUNCTIONAL_UNITS = ("request", "run", "hour")


def _a(x: ArrayLike) -> FloatArray:
    return np.asarray(x, dtype=np.float64)


def facility_joules(it_joules: ArrayLike, pue: ArrayLike) -> FloatArray:
    """IT energy × PUE: the energy the facility drew for it, cooling and losses included."""
    result: FloatArray = _a(it_joules) * _a(pue)
    return result


def operational_grams(facility_j: ArrayLike, intensity_g_per_kwh: ArrayLike) -> FloatArray:
    """Facility energy of each interval × that interval's grid intensity (gCO2e)."""
    result: FloatArray = _a(facility_j) * _a(intensity_g_per_kwh) / JOULES_PER_KWH
    return result


def water_litres(it_joules: ArrayLike, wue_l_per_kwh: ArrayLike) -> FloatArray:
    """IT energy × WUE (litres per IT kWh)."""
    result: FloatArray = _a(it_joules) * _a(wue_l_per_kwh) / JOULES_PER_KWH
    return result


def renewable_joules(facility_j: ArrayLike, share: ArrayLike) -> FloatArray:
    result: FloatArray = _a(facility_j) * _a(share)
    return result


def energy_share(pod_joules: ArrayLike, node_joules: ArrayLike) -> FloatArray:
    """The pod's part of the node's energy in each interval; NaN where the node used none.

    With the agent's conservation (pods + idle and system buckets = node), the shares of all
    pods on a node sum to at most 1; the rest of the server's embodied emissions stays with
    the buckets.
    """
    pod = _a(pod_joules)
    node = _a(node_joules)
    with np.errstate(divide="ignore", invalid="ignore"):
        result: FloatArray = np.where(node > 0, pod / np.where(node > 0, node, 1.0), np.nan)
    return result


def requests_share(requested_cores: ArrayLike, allocatable_cores: ArrayLike) -> FloatArray:
    """CPU requests over the node's allocatable CPUs (SCI's "resources reserved / total")."""
    req = _a(requested_cores)
    alloc = _a(allocatable_cores)
    with np.errstate(divide="ignore", invalid="ignore"):
        result: FloatArray = np.where(alloc > 0, np.minimum(req / np.where(alloc > 0, alloc, 1.0), 1.0), np.nan)
    return result


def embodied_grams(grams_per_second: ArrayLike, seconds: ArrayLike, share: ArrayLike) -> FloatArray:
    """The server's amortised embodied emissions for the interval × the pod's share of it."""
    result: FloatArray = _a(grams_per_second) * _a(seconds) * _a(share)
    return result


@dataclass(frozen=True)
class Totals:
    """Indicators summed over intervals (and pods); ``missing_*`` count intervals left out."""

    it_joules: float
    facility_joules: float
    operational_grams: float
    embodied_grams: float
    water_litres: float
    renewable_joules: float
    missing_site: int = 0  # intervals with IT energy but no operational CO2e (no site, PUE or intensity)
    missing_embodied: int = 0  # intervals with IT energy but no embodied figure or share
    missing_facility: int = 0  # ... but no facility energy (no site or PUE); also not in renewable energy
    missing_water: int = 0  # ... but no water (no site or WUE)
    missing_renewable: int = 0  # ... but no renewable energy (no PUE or renewable share)

    @property
    def it_kwh(self) -> float:
        return self.it_joules / JOULES_PER_KWH

    @property
    def facility_kwh(self) -> float:
        return self.facility_joules / JOULES_PER_KWH

    @property
    def renewable_kwh(self) -> float:
        return self.renewable_joules / JOULES_PER_KWH

    @property
    def carbon_grams(self) -> float:
        """Operational + embodied CO2e."""
        return self.operational_grams + self.embodied_grams

    def sci(self, units: float) -> float:
        """SCI: (operational + embodied) grams per functional unit."""
        return sci(self.operational_grams, self.embodied_grams, units)

    def __add__(self, other: Totals) -> Totals:
        return Totals(
            self.it_joules + other.it_joules,
            self.facility_joules + other.facility_joules,
            self.operational_grams + other.operational_grams,
            self.embodied_grams + other.embodied_grams,
            self.water_litres + other.water_litres,
            self.renewable_joules + other.renewable_joules,
            self.missing_site + other.missing_site,
            self.missing_embodied + other.missing_embodied,
            self.missing_facility + other.missing_facility,
            self.missing_water + other.missing_water,
            self.missing_renewable + other.missing_renewable,
        )


ZERO = Totals(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Indicators:
    """Per-interval indicators, all of one shape (e.g. pods × intervals)."""

    it_joules: FloatArray
    facility_joules: FloatArray
    operational_grams: FloatArray
    embodied_grams: FloatArray
    water_litres: FloatArray
    renewable_joules: FloatArray

    def total(self, where: npt.NDArray[np.bool_] | None = None) -> Totals:
        """Sums over every entry (or those ``where`` is true), NaN entries left out and counted."""

        def pick(x: FloatArray) -> FloatArray:
            return x if where is None else x[where]

        it = pick(self.it_joules)
        used = np.isfinite(it) & (it != 0)

        def s(x: FloatArray) -> float:
            return float(np.nansum(pick(x)))

        def unknown(x: FloatArray) -> int:
            return int(np.count_nonzero(used & ~np.isfinite(pick(x))))

        return Totals(
            s(self.it_joules),
            s(self.facility_joules),
            s(self.operational_grams),
            s(self.embodied_grams),
            s(self.water_litres),
            s(self.renewable_joules),
            unknown(self.operational_grams),
            unknown(self.embodied_grams),
            unknown(self.facility_joules),
            unknown(self.water_litres),
            unknown(self.renewable_joules),
        )


def indicators(
    it_joules: ArrayLike,
    *,
    seconds: ArrayLike,
    pue: ArrayLike,
    intensity: ArrayLike,
    wue: ArrayLike,
    renewable_share: ArrayLike,
    embodied_grams_per_second: ArrayLike,
    share: ArrayLike,
) -> Indicators:
    """Every indicator of each interval (the formulas of the module docstring)."""
    it = _a(it_joules)
    facility = facility_joules(it, pue)
    shape = np.broadcast_shapes(
        it.shape,
        _a(pue).shape,
        _a(intensity).shape,
        _a(wue).shape,
        _a(renewable_share).shape,
        _a(embodied_grams_per_second).shape,
        _a(seconds).shape,
        _a(share).shape,
    )

    def full(x: FloatArray) -> FloatArray:
        return np.broadcast_to(x, shape).astype(np.float64, copy=True)

    return Indicators(
        full(it),
        full(facility),
        full(operational_grams(facility, intensity)),
        full(embodied_grams(embodied_grams_per_second, seconds, share)),
        full(water_litres(it, wue)),
        full(renewable_joules(facility, renewable_share)),
    )


def sci(operational_g: float, embodied_g: float, units: float) -> float:
    """((E × I) + M) per R, gCO2e per functional unit; NaN when there are no units."""
    if not units > 0:
        return float("nan")
    return (operational_g + embodied_g) / units


def functional_units(
    unit: str, *, requests: float | None = None, runs: float | None = None, seconds: float | None = None
) -> float:
    """R of SCI: the number of ``request``\\ s or ``run``\\ s, or the ``hour``\\ s of the period."""
    if unit == "request":
        if requests is None:
            raise ValueError("SCI per request needs the number of requests")
        return float(requests)
    if unit == "run":
        if runs is None:
            raise ValueError("SCI per run needs the number of runs")
        return float(runs)
    if unit == "hour":
        if seconds is None:
            raise ValueError("SCI per hour needs the length of the period")
        return float(seconds) / 3600.0
    raise ValueError(f"functional unit must be one of {', '.join(FUNCTIONAL_UNITS)}, got {unit!r}")
