"""kube-scheduler's arithmetic on hand-checkable cases (the numbers of its own unit tests' kind)."""

from __future__ import annotations

import numpy as np
import pytest

from joulesched.sim import kube


def arr(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


@pytest.mark.parametrize(
    ("percentage", "nodes", "expected"),
    [
        (0, 50, 50),
        (0, 99, 99),
        (0, 100, 100),
        (0, 120, 100),
        (0, 500, 230),
        (0, 1000, 420),
        (0, 5000, 500),
        (0, 6000, 300),
        (100, 1000, 1000),
        (10, 500, 100),
        (30, 1000, 300),
    ],
    ids=[
        "under 100 nodes every node",
        "99 nodes every node",
        "100 nodes: 100",
        "120 nodes: 50 % is below the floor of 100",
        "500 nodes: 46 %",
        "1000 nodes: 42 %",
        "5000 nodes: 10 %",
        "6000 nodes: the 5 % floor",
        "100 % scores all",
        "10 % of 500 is below the floor",
        "an explicit 30 %",
    ],
)
def test_num_feasible_nodes_to_find(percentage: int, nodes: int, expected: int) -> None:
    assert kube.num_feasible_nodes_to_find(percentage, nodes) == expected


def test_least_allocated_worked_example() -> None:
    # cpu (10000-3000)*100/10000 = 70, memory (20000-5000)*100/20000 = 75, (70+75)/2 = 72 (integer)
    assert kube.resource_fit_score("least", arr(3000), arr(10000), arr(5000), arr(20000))[0] == 72


def test_most_allocated_worked_example() -> None:
    # cpu 3000*100/10000 = 30, memory 5000*100/20000 = 25, (30+25)/2 = 27
    assert kube.resource_fit_score("most", arr(3000), arr(10000), arr(5000), arr(20000))[0] == 27


def test_over_committed_resources_score_zero_least_and_full_most() -> None:
    assert kube.least_requested(arr(12000), arr(10000))[0] == 0
    assert kube.most_requested(arr(12000), arr(10000))[0] == 100


def test_balanced_allocation_worked_example() -> None:
    # fractions 0.3 and 0.25: std = 0.025, (1 - 0.025) * 100 = 97.5 -> 97
    assert kube.balanced_allocation_score(arr(3000), arr(10000), arr(5000), arr(20000))[0] == 97
    # equal fractions are perfectly balanced
    assert kube.balanced_allocation_score(arr(5000), arr(10000), arr(10000), arr(20000))[0] == 100


def test_balanced_allocation_caps_fractions_at_one() -> None:
    # cpu 1.5 -> 1, memory 0.5: std 0.25 -> 75
    assert kube.balanced_allocation_score(arr(15000), arr(10000), arr(10000), arr(20000))[0] == 75


def test_topology_spread_prefers_the_node_with_fewer_matching_pods() -> None:
    # two candidates in one zone; weights ln(2+2) for hosts, ln(1+2) for the zone
    host = arr(0, 2)
    zone = arr(2, 2)
    raw_0 = round(0 * np.log(4) + 2 + 2 * np.log(3) + 4)  # 8.197 -> 8
    raw_1 = round(2 * np.log(4) + 2 + 2 * np.log(3) + 4)  # 10.97 -> 11
    scores = kube.topology_spread_scores(host, zone, 1)
    assert list(scores) == [100 * (raw_1 + raw_0 - raw_0) // raw_1, 100 * (raw_1 + raw_0 - raw_1) // raw_1]
    assert scores[0] == 100 and scores[1] == 72


def test_topology_spread_all_equal_is_all_full_marks() -> None:
    assert list(kube.topology_spread_scores(arr(1, 1, 1), arr(3, 3, 3), 1)) == [100, 100, 100]


def test_extender_scores_are_scaled_by_weight_and_ten() -> None:
    assert list(kube.extender_contribution(arr(0, 7, 10), 5)) == [0, 350, 500]


def test_select_host_picks_the_best_and_breaks_ties_from_the_seed() -> None:
    assert kube.select_host(arr(5, 9, 3), np.random.default_rng(0)) == 1
    total = arr(9, 1, 9, 9)
    picks = [kube.select_host(total, np.random.default_rng(s)) for s in range(60)]
    assert set(picks) == {0, 2, 3}
    assert picks == [kube.select_host(total, np.random.default_rng(s)) for s in range(60)]


@pytest.mark.parametrize(("cores", "milli"), [(1.5, 1500), (0.1, 100), (0.0001, 1), (2.0, 2000)])
def test_milli_cpu_rounds_up_like_quantity(cores: float, milli: int) -> None:
    assert kube.milli_cpu(cores) == milli


def test_balanced_allocation_scores_the_balance_improvement_like_v1_37() -> None:
    # kube-scheduler v1.37: 50 + (50 + b(with pod) - b(without)) / 2, b = (1 - |f_cpu - f_mem| / 2) * 100.
    # The node is balanced (0.25, 0.25: b = 100); a cpu-only pod unbalances it (0.5, 0.25: b = 87.5 -> 87).
    args = (arr(4000), arr(8000), arr(4096), arr(16384))
    assert kube.balanced_allocation_score(*args, arr(2000), arr(4096))[0] == 50 + (50 + 87 - 100) // 2 == 68
    # The node leans to cpu (0.5, 0: b = 75); a memory-only pod balances it (0.5, 0.5: b = 100).
    args = (arr(4000), arr(8000), arr(8192), arr(16384))
    assert kube.balanced_allocation_score(*args, arr(4000), arr(0))[0] == 50 + (50 + 100 - 75) // 2 == 87
    # Without the node's own requests: the score of v1.34 and earlier, b(with pod) alone.
    assert kube.balanced_allocation_score(*args)[0] == 100
