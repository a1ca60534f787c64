"""The site model: carbon intensity over time (integrated, never averaged away), fallbacks, embodied amortisation."""

from __future__ import annotations

import numpy as np
import pytest

from joulesched.policy.profile import Site
from joulesched.policy.site import (
    HOURS_PER_YEAR,
    CarbonIntensitySource,
    ConstantIntensity,
    IntensitySeries,
    IntensityUnavailable,
    ServerEmbodied,
    SiteCatalogue,
    SiteModel,
    WithFallback,
    interval_means,
)

H = 3600.0
# Three hours from t = 0: 400, 100, 250 g/kWh.
SERIES = IntensitySeries.regular(0.0, H, [400.0, 100.0, 250.0], label="three hours")


@pytest.mark.parametrize(
    ("a", "b", "integral"),
    [
        pytest.param(0, H, 400 * H, id="one whole hour"),
        pytest.param(0.5 * H, 1.5 * H, 0.5 * H * 400 + 0.5 * H * 100, id="half an hour either side of a change"),
        pytest.param(0, 3 * H, (400 + 100 + 250) * H, id="the whole series"),
        pytest.param(1.25 * H, 1.75 * H, 0.5 * H * 100, id="inside one hour"),
        pytest.param(2 * H, 2 * H, 0.0, id="an empty interval"),
    ],
)
def test_a_series_is_integrated_exactly_as_a_step_function(a: float, b: float, integral: float) -> None:
    assert SERIES.integral(a, b) == pytest.approx(integral)


def test_integrating_is_not_multiplying_by_the_mean() -> None:
    """1 kWh spent in the first hour is 400 g, not the series' mean (250 g)."""
    mean_over_first_hour = interval_means(SERIES, np.array([0.0]), np.array([H]))[0]
    assert mean_over_first_hour == 400.0
    assert float(np.mean(SERIES.values)) == 250.0


def test_values_hold_from_their_timestamp_to_the_next() -> None:
    assert [SERIES.at(t) for t in (0, H - 1, H, 2.5 * H)] == [400, 400, 100, 250]


def test_interval_means_are_vectorised_and_match_one_by_one() -> None:
    starts = np.array([0.0, 0.5 * H, 1.0 * H, 2.0 * H])
    ends = starts + np.array([H, H, 0.0, 0.5 * H])
    means = interval_means(SERIES, starts, ends)
    assert means.tolist() == pytest.approx(
        [400.0, 250.0, 100.0, 250.0]
    )  # a zero-length interval: the value at its instant
    assert interval_means(ConstantIntensity(55.0), starts, ends).tolist() == [55.0] * 4


def test_outside_the_series_error_hold_and_wrap() -> None:
    with pytest.raises(IntensityUnavailable, match="three hours: no value at 10800"):
        SERIES.at(3 * H)
    with pytest.raises(IntensityUnavailable):
        SERIES.integral(-H, H)
    hold = IntensitySeries.regular(0.0, H, [400.0, 100.0, 250.0], outside="hold")
    assert hold.at(-5) == 400 and hold.at(10 * H) == 250
    assert hold.integral(-H, 4 * H) == pytest.approx((400 + 400 + 100 + 250 + 250) * H)
    wrap = IntensitySeries.regular(0.0, H, [400.0, 100.0, 250.0], outside="wrap")
    assert wrap.at(3 * H) == 400 and wrap.at(-0.5 * H) == 250
    assert wrap.integral(2 * H, 5 * H) == pytest.approx((250 + 400 + 100) * H)
    assert wrap.integral(0, 30 * H) == pytest.approx(10 * 750 * H)


@pytest.mark.parametrize("outside", ["error", "hold", "wrap"])
def test_one_interval_integrates_to_the_same_bits_as_many(outside: str) -> None:
    """integral() (scalar, per simulator event) and integrals() (vectorised) are one formula."""
    rng = np.random.default_rng(5)
    origin = 1.6540416e9  # a unix time, as the simulator's series use
    series = IntensitySeries(origin + np.cumsum(rng.uniform(600, 7200, 50)), rng.uniform(0, 900, 50), origin + 4e5, outside)
    lo, hi = (series.starts[0], series.end) if outside == "error" else (origin - 3e5, origin + 2e6)
    a = rng.uniform(lo, hi, 2000)
    b = np.minimum(a + rng.exponential(5000.0, 2000), hi)
    one_by_one = np.array([series.integral(float(x), float(y)) for x, y in zip(a, b, strict=True)])
    assert (one_by_one == series.integrals(a, b)).all()
    if outside == "error":
        with pytest.raises(IntensityUnavailable, match="no value at"):
            series.integral(float(series.end), float(series.end) + 1.0)


def test_an_irregular_series_is_a_step_function_too() -> None:
    s = IntensitySeries(np.array([0.0, 600.0, 3600.0]), np.array([100.0, 300.0, 50.0]), end=7200.0)
    assert s.integral(0, 7200) == pytest.approx(100 * 600 + 300 * 3000 + 50 * 3600)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"starts": [0.0, 0.0], "values": [1.0, 2.0], "end": 10.0}, id="timestamps that do not increase"),
        pytest.param({"starts": [0.0], "values": [-1.0], "end": 10.0}, id="a negative intensity"),
        pytest.param({"starts": [0.0], "values": [1.0], "end": 0.0}, id="an end before the last value"),
        pytest.param({"starts": [0.0], "values": [np.nan], "end": 1.0}, id="a NaN"),
        pytest.param({"starts": [], "values": [], "end": 1.0}, id="no values"),
    ],
)
def test_an_impossible_series_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        IntensitySeries(np.array(bad["starts"]), np.array(bad["values"]), float(bad["end"]))  # type: ignore[arg-type]


class DeadLiveSource:
    """A live carbon API that is down: what a real client raises when it cannot answer."""

    name = "live api"

    def at(self, t: float) -> float:
        raise IntensityUnavailable("live api: connection refused")

    def integral(self, a: float, b: float) -> float:
        raise IntensityUnavailable("live api: connection refused")


def test_a_failing_source_falls_back_softly() -> None:
    assert isinstance(DeadLiveSource(), CarbonIntensitySource)
    soft = WithFallback(DeadLiveSource(), ConstantIntensity(300.0, "regional mean"))
    assert soft.at(0.0) == 300.0 and soft.integral(0, H) == 300.0 * H
    assert soft.answered_by(0.0) == "regional mean"
    covered = WithFallback(SERIES, ConstantIntensity(300.0))
    assert covered.at(0.0) == 400.0 and covered.at(10 * H) == 300.0
    assert covered.answered_by(0.0) == "three hours"
    assert interval_means(covered, np.array([0.0, 5 * H]), np.array([H, 6 * H])).tolist() == [400.0, 300.0]


def test_embodied_emissions_are_amortised_per_hour_of_use() -> None:
    server = ServerEmbodied(embodied_kg=1971.0, lifetime_years=4.0)  # 4 × 8760 h
    assert server.lifetime_seconds == 4 * HOURS_PER_YEAR * H == 126_144_000
    assert server.grams_per_hour == pytest.approx(1_971_000 / 35_040)  # 56.25 g per hour
    assert server.grams_per_second == pytest.approx(0.015625)


def test_a_site_gives_the_extender_its_intensity_at_a_time() -> None:
    site = SiteModel("north", pue=1.1, wue=0.3, renewable_share=0.5, carbon=SERIES)
    assert site.profile_site(1.5 * H) == Site("north", 1.1, 100.0, 0.3, 0.5)


def test_the_catalogue_finds_sites_by_nadiki_facility_and_rack() -> None:
    north = SiteModel("north", facility_id="FACILITY-NLD-001", rack_ids=("RACK-FACILITY-NLD-001-001",))
    catalogue = SiteCatalogue({"north": north}, {"srv-1": ServerEmbodied(2500, 5)}, ServerEmbodied(1300, 4))
    assert catalogue.site_of_facility("FACILITY-NLD-001") is north
    assert catalogue.site_of_rack("RACK-FACILITY-NLD-001-001") is north
    assert catalogue.site_of_facility("FACILITY-DEU-001") is None
    assert catalogue.embodied("srv-1") == ServerEmbodied(2500, 5)
    assert catalogue.embodied("unknown") == ServerEmbodied(1300, 4)
