"""The deferral rule (policy/deferral.py), on worked series."""

from __future__ import annotations

import math

import pytest

from joulesched.policy.deferral import (
    DEADLINE_ANNOTATION,
    MAX_DELAY_ANNOTATION,
    Deferral,
    decide,
    deferral_from_pod,
)
from joulesched.policy.demand import RUNTIME_ANNOTATION
from joulesched.policy.errors import PolicyError
from joulesched.policy.site import ConstantIntensity, IntensitySeries

H = 3600.0
# 300 g/kWh for hours 0-5, 100 for hours 6-8, 400 after: the clean hours are 6..9.
DAY = IntensitySeries.regular(0.0, H, [300] * 6 + [100] * 3 + [400] * 15, outside="error")


def test_holds_until_the_clean_hours_then_releases() -> None:
    d = Deferral(submitted=0.0, deadline=12 * H, runtime=2 * H)
    first = decide(d, 0.0, DAY)
    assert not first.release and first.reason == "hold"
    assert first.planned_start == 6 * H
    assert first.now_mean == 300 and first.planned_mean == 100
    at_six = decide(d, 6 * H, DAY)
    assert at_six.release and at_six.reason == "clean"


def test_never_later_than_deadline_minus_runtime() -> None:
    # The clean hours start at 6 h but the run must end by 5 h: released at the latest start.
    d = Deferral(submitted=0.0, deadline=5 * H, runtime=2 * H)
    # hours 0-5 are equally dirty: nothing in the window beats starting now
    assert decide(d, 0.0, DAY).reason == "clean"
    late = decide(d, 3 * H, DAY)
    assert late.release and late.reason == "deadline"


def test_passed_deadline_and_impossible_runtime_release_at_once() -> None:
    assert decide(Deferral(0.0, 4 * H, H), 5 * H, DAY).reason == "expired"
    assert decide(Deferral(0.0, H, 2 * H), 0.0, DAY).reason == "expired"


def test_flat_intensity_releases_at_once() -> None:
    d = Deferral(0.0, 12 * H, H)
    dec = decide(d, 0.0, ConstantIntensity(250.0))
    assert dec.release and dec.reason == "clean"


def test_tolerance_releases_near_the_best() -> None:
    series = IntensitySeries.regular(0.0, H, [101, 100, 300, 300], outside="hold")
    d = Deferral(0.0, 4 * H, H)
    assert decide(d, 0.0, series, tolerance=0.02).release
    assert not decide(d, 0.0, series, tolerance=0.0).release


def test_no_forecast_releases() -> None:
    d = Deferral(0.0, 12 * H, H)
    assert decide(d, 0.0, None).reason == "no_forecast"
    # a forecast that ends before a run starting now ends
    short = IntensitySeries.regular(0.0, H, [300.0] * 1, outside="error")
    assert decide(Deferral(0.0, 12 * H, 2 * H), 0.0, short).reason == "no_forecast"


def test_horizon_limits_candidates() -> None:
    # forecast covers 8 h only: later starts are skipped, the plan stays inside the horizon
    series = IntensitySeries.regular(0.0, H, [300, 300, 300, 50, 300, 300, 300, 300], outside="error")
    dec = decide(Deferral(0.0, 24 * H, H), 0.0, series)
    assert not dec.release and dec.planned_start == 3 * H


def test_terms_from_annotations() -> None:
    pod = {"metadata": {"annotations": {MAX_DELAY_ANNOTATION: "43200", RUNTIME_ANNOTATION: "3600"}}}
    d = deferral_from_pod(pod, created=1000.0)
    assert d == Deferral(1000.0, 1000.0 + 43200, 3600.0)
    both = {"metadata": {"annotations": {MAX_DELAY_ANNOTATION: "43200", DEADLINE_ANNOTATION: "1970-01-01T01:00:00Z"}}}
    assert deferral_from_pod(both, created=0.0) == Deferral(0.0, 3600.0, 0.0)
    assert deferral_from_pod({"metadata": {}}, created=0.0) is None


@pytest.mark.parametrize(
    ("annotations", "named"),
    [
        ({DEADLINE_ANNOTATION: "tomorrow"}, DEADLINE_ANNOTATION),
        ({DEADLINE_ANNOTATION: "2026-12-01T18:00:00"}, DEADLINE_ANNOTATION),
        ({MAX_DELAY_ANNOTATION: "-5"}, MAX_DELAY_ANNOTATION),
        ({MAX_DELAY_ANNOTATION: "nan"}, MAX_DELAY_ANNOTATION),
        ({MAX_DELAY_ANNOTATION: "1e400"}, MAX_DELAY_ANNOTATION),
        ({MAX_DELAY_ANNOTATION: "60", RUNTIME_ANNOTATION: "x"}, RUNTIME_ANNOTATION),
    ],
)
def test_malformed_annotations_name_what(annotations: dict[str, str], named: str) -> None:
    with pytest.raises(PolicyError, match=named):
        deferral_from_pod({"metadata": {"annotations": annotations}}, created=0.0)


def test_terms_must_be_finite() -> None:
    with pytest.raises(PolicyError):
        Deferral(0.0, math.inf, 0.0)


def test_lowest_of_sites_is_the_pointwise_minimum() -> None:
    from joulesched.policy.deferral import LowestOf

    a = IntensitySeries.regular(0.0, H, [300, 100, 300, 300], outside="error")
    b = IntensitySeries.regular(0.0, H, [200, 250, 50, 300], outside="error")
    low = LowestOf((a, b, ConstantIntensity(280.0)))
    assert low.at(0.5 * H) == 200 and low.at(2.5 * H) == 50 and low.at(3.5 * H) == 280
    assert low.integral(0.0, 4 * H) == pytest.approx((200 + 100 + 50 + 280) * H)
    assert low.integral(0.5 * H, 1.5 * H) == pytest.approx((200 * 0.5 + 100 * 0.5) * H)
    # the plan follows the cleanest site
    dec = decide(Deferral(0.0, 4 * H, H), 0.0, low)
    assert not dec.release and dec.planned_start == 2 * H


def test_a_deadline_more_than_a_month_after_creation_is_refused_as_a_delay_is() -> None:
    """A typo (2300 for 2030) would otherwise search decades of candidates every tick."""
    created = 1_767_225_600.0  # 2026-01-01
    far = {"metadata": {"annotations": {DEADLINE_ANNOTATION: "2300-01-01T00:00:00Z"}}}
    with pytest.raises(PolicyError, match=f"{DEADLINE_ANNOTATION}: must be within 2.6784e\\+06 seconds of the pod's creation"):
        deferral_from_pod(far, created)
    both = {"metadata": {"annotations": {DEADLINE_ANNOTATION: "2300-01-01T00:00:00Z", MAX_DELAY_ANNOTATION: "3600"}}}
    assert deferral_from_pod(both, created) == Deferral(created, created + 3600, 0.0), "the earlier one wins"


def test_a_release_is_not_left_to_a_next_decision_that_comes_after_the_latest_start() -> None:
    terms = Deferral(0.0, 9 * H, 3 * H)  # latest start 6 h: the clean hours' first instant
    assert decide(terms, 6 * H - 30, DAY, tolerance=0.0).reason == "hold"
    at = decide(terms, 6 * H - 30, DAY, tolerance=0.0, next_decision=6 * H + 15)
    assert (at.release, at.reason) == (True, "deadline")
    no_runtime = Deferral(0.0, 6 * H, 0.0)  # latest start = deadline: released as deadline there, not expired
    assert decide(no_runtime, 6 * H, DAY).reason == "deadline"
    assert decide(no_runtime, 6 * H + 1, DAY).reason == "expired"


def test_a_flat_forecast_ties_to_now_even_with_no_tolerance() -> None:
    """Means of one flat value differ in their last bits (cumulative sums): still ties."""
    flat = IntensitySeries.regular(0.0, H, [123.456, 77.7] + [123.456] * 46, outside="error")
    decision = decide(Deferral(0.0, 40 * H, 1800.0), 3 * H + 17, flat, tolerance=0.0)
    assert (decision.release, decision.reason) == (True, "clean"), decision


def test_the_lowest_of_several_sites_skips_a_site_cell_by_cell_where_it_has_no_value() -> None:
    from joulesched.policy.deferral import LowestOf

    short = IntensitySeries.regular(0.0, H, [100.0] * 10, outside="error")  # its forecast ends at hour 10
    long = IntensitySeries.regular(0.0, H, [400.0] * 12 + [350.0] * 36, outside="error")
    lowest = LowestOf((short, long))
    assert lowest.integral(9 * H, 11 * H) / (2 * H) == 250.0, "100 while both answer, then 400"
    decision = decide(Deferral(0.0, 30 * H, 2 * H), 9 * H, lowest)
    assert (decision.release, decision.reason) == (True, "clean"), "250 now against 350 at best later"
