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
