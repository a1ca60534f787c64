"""Forecasts a deferrer would have had (policy/forecast.py), and LowestOf as one series."""

from __future__ import annotations

import numpy as np
import pytest

from joulesched.policy.deferral import LowestOf
from joulesched.policy.errors import PolicyError
from joulesched.policy.forecast import FORECASTS, issue
from joulesched.policy.site import ConstantIntensity, IntensitySeries, IntensityUnavailable

H = 3600.0
DAY = 24 * H
# Ten days of hourly values, each distinct: the value names its hour.
TEN_DAYS = IntensitySeries.regular(0.0, H, np.arange(240, dtype=float), outside="error")


def test_perfect_is_the_series_from_the_hour_in_force() -> None:
    f = issue(TEN_DAYS, 8 * DAY + 0.5 * H, "perfect", horizon=30 * H)
    assert isinstance(f, IntensitySeries)
    assert f.starts[0] == 8 * DAY and f.end >= 8 * DAY + 30.5 * H
    assert f.values.tolist() == list(range(192, 192 + len(f.values)))


def test_persistence_repeats_the_last_known_day() -> None:
    f = issue(TEN_DAYS, 8 * DAY + 0.5 * H, "persistence", horizon=30 * H)
    assert isinstance(f, IntensitySeries)
    assert f.values[0] == 192  # the hour in force is known
    assert f.values[1] == 193 - 24  # tomorrow's hour from yesterday's
    assert f.values[24] == 192  # 24 h ahead: the hour in force is the last known of its clock hour
    assert f.values[25] == 217 - 48  # the second day ahead: two days back


def test_day_ahead_is_the_mean_of_the_past_week() -> None:
    f = issue(TEN_DAYS, 8 * DAY + 0.5 * H, "day-ahead", horizon=30 * H)
    assert isinstance(f, IntensitySeries)
    assert f.values[1] == pytest.approx(np.mean([193 - 24 * k for k in range(1, 8)]))
    assert f.values[24] == pytest.approx(np.mean([216 - 24 * k for k in range(1, 8)]))
    # three days of history: the mean of those that exist
    short = issue(TEN_DAYS, 3 * DAY + 0.5 * H, "day-ahead", horizon=4 * H)
    assert isinstance(short, IntensitySeries)
    assert short.values[1] == pytest.approx(np.mean([73 - 24, 73 - 48, 73 - 72]))


@pytest.mark.parametrize("issued", [5 * DAY, 5 * DAY + 1.0, 8 * DAY + 0.5 * H, 9 * DAY - 1.0])
@pytest.mark.parametrize("method", ["persistence", "day-ahead"])
def test_realistic_forecasts_never_read_after_the_issue_time(method: str, issued: float) -> None:
    # Every step that begins after the issue time changed: a realistic forecast must not move.
    values = TEN_DAYS.values.copy()
    later = TEN_DAYS.starts > issued
    values[later] = 10_000.0 + values[later] * 7
    changed = IntensitySeries(TEN_DAYS.starts, values, TEN_DAYS.end, "error")
    a = issue(TEN_DAYS, issued, method, horizon=30 * H)
    b = issue(changed, issued, method, horizon=30 * H)
    assert isinstance(a, IntensitySeries) and isinstance(b, IntensitySeries)
    assert a.values.tolist() == b.values.tolist()
    # the test can fail: the perfect forecast does see the change
    pa, pb = issue(TEN_DAYS, issued, "perfect", 30 * H), issue(changed, issued, "perfect", 30 * H)
    assert isinstance(pa, IntensitySeries) and isinstance(pb, IntensitySeries)
    assert pa.values.tolist() != pb.values.tolist()


def test_a_wrapping_series_forecasts_across_its_year_end() -> None:
    day = IntensitySeries.regular(0.0, H, np.arange(24, dtype=float), outside="wrap")
    f = issue(day, 10 * DAY + 23.5 * H, "persistence", horizon=3 * H)
    assert isinstance(f, IntensitySeries)
    assert f.values.tolist() == [23.0, 0.0, 1.0, 2.0]


def test_constants_and_bad_input() -> None:
    c = ConstantIntensity(250.0)
    assert all(issue(c, 123.0, m) is c for m in FORECASTS)
    with pytest.raises(PolicyError, match="method"):
        issue(TEN_DAYS, 0.0, "tomorrow")
    with pytest.raises(PolicyError, match="horizon"):
        issue(TEN_DAYS, 0.0, "perfect", horizon=0.0)
    uneven = IntensitySeries(np.array([0.0, H, 3 * H]), np.array([1.0, 2.0, 3.0]), 4 * H)
    with pytest.raises(PolicyError, match="evenly spaced"):
        issue(uneven, H, "perfect")
    with pytest.raises(IntensityUnavailable):
        issue(TEN_DAYS, -5 * H, "persistence")


def test_the_forecast_ends_where_history_runs_out() -> None:
    # the series ends after day 9: the perfect forecast stops there, not at the horizon
    f = issue(TEN_DAYS, 9 * DAY + 20 * H, "perfect", horizon=30 * H)
    assert isinstance(f, IntensitySeries)
    assert f.end == 10 * DAY


def test_lowest_of_as_one_series_matches_its_integral() -> None:
    a = IntensitySeries.regular(0.0, H, [300, 100, 300, 300, 90, 400], outside="error")
    b = IntensitySeries.regular(0.0, H, [200, 250, 50, 300, 80, 10], outside="error")
    low = LowestOf((a, b, ConstantIntensity(280.0)))
    series = low.as_series(0.25 * H, 6 * H)
    for x, y in [(0.25 * H, 6 * H), (0.5 * H, 2.7 * H), (1.0 * H, 1.1 * H), (4.2 * H, 5.9 * H)]:
        assert series.integral(x, y) == pytest.approx(low.integral(x, y))
    with pytest.raises(PolicyError):
        low.as_series(H, H)
