"""P(u): the one interpolation, the node's drawn power (held at P(1)) and the time-shared cost."""

from __future__ import annotations

import numpy as np
import pytest

from joulesched.policy.power import curve_power, drawn_watts, gpu_watts
from joulesched.policy.scoring import curve_power as scoring_curve_power

EPYC = (56.8, 100.0, 116.0, 130.0, 143.0, 162.0, 191.0, 211.0, 231.0, 250.0, 268.0)  # SPECpower DL325 Gen10 Plus


@pytest.mark.parametrize(
    ("u", "watts"),
    [(0.0, 56.8), (0.1, 100.0), (0.05, 78.4), (0.95, 259.0), (1.0, 268.0), (1.5, 268.0), (-0.2, 56.8)],
    ids=["idle", "first point", "half way to 10 %", "between the last points", "full load", "overloaded holds P(1)", "below 0"],
)
def test_drawn_watts_interpolates_and_holds_the_last_point_above_full_load(u: float, watts: float) -> None:
    assert drawn_watts(EPYC, u) == pytest.approx(watts)


def test_drawn_and_cost_power_are_the_same_number_up_to_full_load() -> None:
    u = np.concatenate((np.linspace(0.0, 1.0, 1001), np.random.default_rng(3).random(500)))
    vector = curve_power(np.array([EPYC] * len(u)), u)
    scalar = np.array([drawn_watts(EPYC, float(x)) for x in u])
    assert (vector == scalar).all()  # bit for bit: one interpolation


def test_above_full_load_the_cost_time_shares_and_the_drawn_power_does_not() -> None:
    for u in (1.25, 2.0, 3.5):
        assert curve_power(np.array([EPYC]), np.array([u]))[0] == pytest.approx(EPYC[-1] * u)
        assert drawn_watts(EPYC, u) == EPYC[-1]


def test_the_scoring_uses_the_one_curve_power() -> None:
    assert scoring_curve_power is curve_power


@pytest.mark.parametrize(
    ("count", "busy", "watts"),
    [(0, 0.0, 0.0), (4, 0.0, 4 * 60.0), (4, 1.5, 4 * 60.0 + 1.5 * 240.0), (4, 9.0, 4 * 300.0), (2, 2.0, 600.0)],
    ids=["no GPU", "idle", "one and a half busy", "busy past the count: all four at the limit", "both busy"],
)
def test_gpu_watts_is_idle_power_each_plus_the_busy_share_of_the_span(count: int, busy: float, watts: float) -> None:
    assert gpu_watts(count, 60.0, 300.0, busy) == watts
    per_node = gpu_watts(np.array([count, 4.0]), np.array([60.0, 60.0]), np.array([300.0, 300.0]), np.array([busy, 0.0]))
    assert per_node.tolist() == [watts, 240.0], "one value per node, the same numbers"
