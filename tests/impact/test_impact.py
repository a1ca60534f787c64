"""The indicators, each with a worked example that can be checked by hand (docs/impact.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from joulesched.policy import impact
from joulesched.policy.site import IntensitySeries, ServerEmbodied, interval_means

H = 3600.0


def test_facility_energy_is_it_energy_times_pue() -> None:
    assert impact.facility_joules(3.6e6, 1.5) == 5.4e6  # 1 kWh of IT → 1.5 kWh from the grid


def test_operational_carbon_is_facility_energy_times_intensity() -> None:
    assert impact.operational_grams(5.4e6, 400.0) == pytest.approx(600.0)  # 1.5 kWh × 400 g/kWh


def test_water_is_it_energy_times_wue() -> None:
    """WUE is litres per IT kWh (The Green Grid): 1 kWh of IT at WUE 1.8 uses 1.8 L, whatever the PUE."""
    assert impact.water_litres(3.6e6, 1.8) == pytest.approx(1.8)


def test_renewable_energy_is_the_share_of_facility_energy() -> None:
    assert impact.renewable_joules(5.4e6, 0.25) == 1.35e6


def test_embodied_carbon_is_the_amortised_server_times_the_share() -> None:
    """A 1971 kg server over 4 years (0.015625 g/s); a pod using 60 % of it for an hour: 33.75 g."""
    rate = ServerEmbodied(1971.0, 4.0).grams_per_second
    assert impact.embodied_grams(rate, H, 0.6) == pytest.approx(0.015625 * 3600 * 0.6)


@pytest.mark.parametrize(
    ("pod", "node", "share"),
    [
        pytest.param(7200.0, 12000.0, 0.6, id="a pod with 60 % of the node's energy"),
        pytest.param(0.0, 12000.0, 0.0, id="an idle pod"),
        pytest.param(10.0, 0.0, math.nan, id="a node with no energy measured: no share"),
    ],
)
def test_energy_share(pod: float, node: float, share: float) -> None:
    got = float(impact.energy_share(pod, node))
    assert (math.isnan(got) and math.isnan(share)) or got == pytest.approx(share)


def test_requests_share_is_capped_at_the_whole_node() -> None:
    assert impact.requests_share(np.array([16.0, 96.0, 4.0]), np.array([64.0, 64.0, 0.0])).tolist()[:2] == [0.25, 1.0]
    assert math.isnan(float(impact.requests_share(4.0, 0.0)))


def test_sci_per_functional_unit() -> None:
    """SCI = (O + M) / R: 600 g operational + 33.75 g embodied over 1000 requests."""
    assert impact.sci(600.0, 33.75, 1000) == pytest.approx(0.63375)
    assert math.isnan(impact.sci(1.0, 1.0, 0))
    assert impact.functional_units("hour", seconds=5400) == 1.5
    assert impact.functional_units("run", runs=3) == 3
    assert impact.functional_units("request", requests=1e4) == 1e4
    with pytest.raises(ValueError, match="needs the number of requests"):
        impact.functional_units("request")
    with pytest.raises(ValueError, match="must be one of request, run, hour"):
        impact.functional_units("gigabyte")


def test_the_worked_example_of_the_docs() -> None:
    """docs/impact.md: a 120 W pod for 80 minutes on a 200 W node at a PUE 1.5 site whose grid
    is 400 g/kWh for the first 50 minutes and 100 g/kWh after, WUE 2, renewable share 0.25, on a
    server of 1971 kg over 4 years — in one-minute intervals."""
    minutes = 80
    t = np.arange(minutes, dtype=float) * 60.0
    grid = IntensitySeries(np.array([0.0, 3000.0]), np.array([400.0, 100.0]), end=7200.0)
    result = impact.indicators(
        np.full(minutes, 120.0 * 60),
        seconds=60.0,
        pue=1.5,
        intensity=interval_means(grid, t, t + 60.0),
        wue=2.0,
        renewable_share=0.25,
        embodied_grams_per_second=ServerEmbodied(1971.0, 4.0).grams_per_second,
        share=impact.energy_share(120.0 * 60, 200.0 * 60),
    )
    total = result.total()
    assert total.it_kwh == pytest.approx(0.16)
    assert total.facility_kwh == pytest.approx(0.24)
    assert total.operational_grams == pytest.approx(0.24 * 50 / 80 * 400 + 0.24 * 30 / 80 * 100)  # 60 + 9
    assert total.embodied_grams == pytest.approx(45.0)
    assert total.carbon_grams == pytest.approx(114.0)
    assert total.water_litres == pytest.approx(0.32)
    assert total.renewable_kwh == pytest.approx(0.06)
    assert total.sci(impact.functional_units("hour", seconds=minutes * 60)) == pytest.approx(114.0 / (4 / 3))


def test_an_interval_across_an_intensity_change_gets_the_integral_not_either_value() -> None:
    grid = IntensitySeries(np.array([0.0, 30.0]), np.array([400.0, 100.0]), end=3600.0)
    mean = interval_means(grid, np.array([0.0]), np.array([60.0]))
    assert mean.tolist() == [250.0]  # half the minute at 400, half at 100


def test_missing_factors_leave_indicators_out_and_are_counted() -> None:
    result = impact.indicators(
        np.array([100.0, 100.0, 0.0]),
        seconds=60.0,
        pue=np.array([1.5, np.nan, np.nan]),
        intensity=np.array([400.0, np.nan, np.nan]),
        wue=np.array([2.0, np.nan, np.nan]),
        renewable_share=np.array([0.0, np.nan, np.nan]),
        embodied_grams_per_second=np.array([0.01, 0.01, np.nan]),
        share=np.array([0.5, np.nan, np.nan]),
    )
    total = result.total()
    assert total.it_joules == 200.0  # IT energy is always counted
    assert total.facility_joules == 150.0  # the second interval has no site: left out
    assert total.missing_site == 1 and total.missing_embodied == 1  # the idle third interval is not "missing"
    where = np.array([True, False, False])
    assert result.total(where).missing_site == 0


def test_totals_add_up() -> None:
    a = impact.Totals(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 1, 0)
    b = impact.Totals(10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 0, 2)
    assert a + b == impact.Totals(11.0, 22.0, 33.0, 44.0, 55.0, 66.0, 1, 2)
    assert impact.ZERO + a == a


def test_embodied_shares_of_a_node_add_up_to_what_the_pods_used() -> None:
    """Conservation: pods sharing a node by energy get the server's embodied emissions in the
    same proportions, and all of it when the pods took all of the node's energy."""
    rng = np.random.default_rng(7)
    pods = rng.uniform(0, 100, size=(5, 30))
    node = pods.sum(axis=0) * 1.25  # 20 % stays in the idle/system buckets
    shares = impact.energy_share(pods, node)
    embodied = impact.embodied_grams(0.02, 60.0, shares)
    assert embodied.sum(axis=0) == pytest.approx(np.full(30, 0.02 * 60 * 0.8))
    full = impact.embodied_grams(0.02, 60.0, impact.energy_share(pods, pods.sum(axis=0)))
    assert full.sum() == pytest.approx(0.02 * 60 * 30)
