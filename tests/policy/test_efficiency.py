"""The ranking formula shared by `joulesched expander` and the simulator's priority expander."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from joulesched.policy.efficiency import (
    Efficiency,
    cpu_joules_per_work,
    efficiency,
    gpu_joules_per_work,
    group_efficiency,
    priorities,
    tiers,
)

REPO = Path(__file__).resolve().parents[2]
EPYC_7763 = [56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268]


def specpower_curves() -> dict[str, tuple[list[float], int]]:
    out = {}
    with open(REPO / "sim/data/power/specpower_selected_curves.csv", newline="") as f:
        for row in csv.DictReader(f):
            points = [float(row["idle"])] + [float(row[f"p{k}0"]) for k in range(1, 10)] + [float(row["p100"])]
            out[f"{row['model']} {row['cpu']}"] = (points, int(row["threads"]))
    return out


def test_worked_example_epyc_7763() -> None:
    # Σ P over active idle and the ten loads: 56.8 + 100 + ... + 268 = 1858.8 W
    # Σ work: (0.1 + ... + 1.0) × 64 cores × speed 1 = 5.5 × 64 = 352 units
    assert sum(EPYC_7763) == pytest.approx(1858.8)
    assert cpu_joules_per_work(EPYC_7763, 64, 1.0) == pytest.approx(1858.8 / 352)  # 5.281 J per unit
    assert cpu_joules_per_work(EPYC_7763, 64, 1.0) == pytest.approx(5.2807, abs=1e-4)
    # twice as fast per core: half the joules per unit of work
    assert cpu_joules_per_work(EPYC_7763, 64, 2.0) == pytest.approx(1858.8 / 704)


def test_figure_from_the_shipped_specpower_csv() -> None:
    curves = specpower_curves()
    points, threads = curves["ProLiant DL325 Gen10 Plus AMD EPYC 7763 2.45 GHz"]
    assert points == EPYC_7763 and threads == 128
    # the CSV's row, at its 128 threads: the same 1858.8 W over 5.5 × 128 units
    assert efficiency(points, threads).cost == pytest.approx(1858.8 / 704)
    # SPECpower's own overall figure is ops/W; ours is its inverse in core-units: a curve that is
    # everywhere 10 % higher at the same work costs exactly 10 % more
    assert cpu_joules_per_work([p * 1.1 for p in points], threads) == pytest.approx(1.1 * cpu_joules_per_work(points, threads))


def test_idle_power_counts_as_in_specpower() -> None:
    low_idle = [10, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268]
    assert cpu_joules_per_work(low_idle, 64) == pytest.approx((1858.8 - 46.8) / 352)
    assert cpu_joules_per_work(low_idle, 64) < cpu_joules_per_work(EPYC_7763, 64)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="11 points"):
        cpu_joules_per_work([1, 2, 3], 4)
    with pytest.raises(ValueError, match="cores and speed"):
        cpu_joules_per_work(EPYC_7763, 0)
    with pytest.raises(ValueError, match="strategy"):
        efficiency(EPYC_7763, 64, strategy="cheapest")
    with pytest.raises(ValueError, match="at least one"):
        group_efficiency([])


def test_gpu_figure() -> None:
    # H100 SXM of example-nodes.yaml: 70 W idle, 700 W max, speed 1
    # (11 × 70 + 5.5 × 630) / 5.5 = (770 + 3465) / 5.5 = 770 J per GPU-unit
    assert gpu_joules_per_work(70, 700, 1.0) == pytest.approx(770.0)
    assert gpu_joules_per_work(70, 700, 2.0) == pytest.approx(385.0)
    e = efficiency(EPYC_7763, 64, gpu_count=8, gpu_idle_watts=70, gpu_max_watts=700)
    assert e == Efficiency(True, pytest.approx(770.0))  # per GPU: the count does not matter


def test_carbon_is_energy_times_pue_times_intensity() -> None:
    e = efficiency(EPYC_7763, 64, pue=1.5, carbon_intensity=400, strategy="carbon")
    assert e.cost == pytest.approx(1858.8 / 352 * 1.5 * 400 / 3.6e6)
    # a clean site beats a more efficient machine on a dirty grid
    dirty = efficiency([p * 0.8 for p in EPYC_7763], 64, pue=1.58, carbon_intensity=441, strategy="carbon")
    clean = efficiency(EPYC_7763, 64, pue=1.10, carbon_intensity=55, strategy="carbon")
    assert clean < dirty
    assert efficiency([p * 0.8 for p in EPYC_7763], 64) < efficiency(EPYC_7763, 64)  # but not on energy


def test_priorities_most_efficient_highest_with_ties_within_one_percent() -> None:
    base = cpu_joules_per_work(EPYC_7763, 64)
    figures = {
        "a": Efficiency(False, base),
        "b": Efficiency(False, base * 1.009),  # within 1 % of a: same tier
        "c": Efficiency(False, base * 1.011),  # 1.1 % above a: next tier
        "d": Efficiency(False, base * 3),
        "g": Efficiency(True, 100.0),  # GPU types rank below every CPU type, however small the figure
    }
    assert tiers(figures) == [["a", "b"], ["c"], ["d"], ["g"]]
    assert priorities(figures) == {40: ["a", "b"], 30: ["c"], 20: ["d"], 10: ["g"]}
    # the tolerance is measured from the tier's first member, not chained
    chain = {"x": Efficiency(False, 1.0), "y": Efficiency(False, 1.008), "z": Efficiency(False, 1.016)}
    assert tiers(chain) == [["x", "y"], ["z"]]


def test_priorities_are_deterministic_and_independent_of_input_order() -> None:
    figures = {n: Efficiency(n.startswith("g"), float(len(n))) for n in ("bb", "a", "gpu1", "cc", "g2")}
    reordered = dict(reversed(list(figures.items())))
    assert priorities(figures) == priorities(reordered) == {40: ["a"], 30: ["bb", "cc"], 20: ["g2"], 10: ["gpu1"]}


def test_gpu_types_rank_among_themselves_by_gpu_figure() -> None:
    h100 = efficiency(EPYC_7763, 64, gpu_count=8, gpu_idle_watts=70, gpu_max_watts=700, gpu_speed=1.0)
    a100 = efficiency(EPYC_7763, 64, gpu_count=4, gpu_idle_watts=50, gpu_max_watts=400, gpu_speed=0.4)
    cpu = efficiency(EPYC_7763, 64)
    assert a100.cost == pytest.approx((11 * 50 + 5.5 * 350) / (5.5 * 0.4))  # 1125 J per H100-unit
    assert priorities({"h100": h100, "a100": a100, "cpu": cpu}) == {30: ["cpu"], 20: ["h100"], 10: ["a100"]}


def test_group_figure_is_the_median_of_its_nodes() -> None:
    group = [Efficiency(False, 5.0), Efficiency(False, 5.2), Efficiency(False, 50.0)]
    assert group_efficiency(group) == Efficiency(False, 5.2)
    mixed = [Efficiency(False, 5.0), Efficiency(True, 700.0)]
    assert group_efficiency(mixed) == Efficiency(True, 700.0)


def test_a_group_whose_carbon_is_unknown_ranks_last_never_first() -> None:
    # A site without carbon data gives NaN under carbon: no data, no advantage (sorting NaN
    # put such a group first, at the highest priority).
    nan = float("nan")
    figures = {"a": Efficiency(False, nan), "b": Efficiency(False, 800.0), "c": Efficiency(False, 50.0), "d": Efficiency(True, nan)}
    assert tiers(figures) == [["c"], ["b"], ["a", "d"]]
    assert priorities(figures) == {30: ["c"], 20: ["b"], 10: ["a", "d"]}
    assert priorities(dict(reversed(list(figures.items())))) == priorities(figures)
    # a group's figure is its known members' median; unknown only when none is known
    assert group_efficiency([Efficiency(False, nan), Efficiency(False, 5.0), Efficiency(False, 7.0)]) == Efficiency(False, 6.0)
    unknown = group_efficiency([Efficiency(False, nan)])
    assert not unknown.gpu and unknown.cost != unknown.cost
