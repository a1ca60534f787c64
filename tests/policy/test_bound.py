from __future__ import annotations

import numpy as np
import pytest

from joulesched.policy.bound import (
    concat,
    fill_cheapest_first,
    fill_nodes_by_requests,
    hull_pieces,
    lower_convex_hull,
)

LINEAR_10 = [100.0 + 10.0 * i for i in range(11)]  # 10 cores: 10 W per busy core
LINEAR_20 = [100.0 + 20.0 * i for i in range(11)]  # 10 cores: 20 W per busy core


def test_hull_of_a_non_convex_curve() -> None:
    # a bump at 20 % and a knee at 50 %: the hull skips 10-40 % and 60-90 % (collinear or above)
    curve = [50, 90, 95, 100, 105, 110, 130, 150, 170, 190, 210]
    u, w = lower_convex_hull(np.linspace(0, 1, 11), curve)
    assert u.tolist() == pytest.approx([0.0, 0.5, 1.0])
    assert w.tolist() == [50, 110, 210]
    # every curve point lies on or above the hull
    assert np.all(np.interp(np.linspace(0, 1, 11), u, w) <= np.asarray(curve) + 1e-12)


def test_hull_of_a_concave_curve_is_the_chord() -> None:
    curve = [100, 150, 180, 200, 210, 215, 218, 220, 221, 222, 223]
    u, w = lower_convex_hull(np.linspace(0, 1, 11), curve)
    assert u.tolist() == [0.0, 1.0] and w.tolist() == [100, 223]


def test_pieces_costs_and_capacities() -> None:
    p = hull_pieces([50, 90, 95, 100, 105, 110, 130, 150, 170, 190, 210], cores=10, speed=2.0, count=3)
    # slope 120 W per unit utilisation over 0..0.5 on 10 cores × speed 2 → 6 W per reference core
    assert p.cost.tolist() == pytest.approx([6.0, 10.0])
    assert p.capacity.tolist() == pytest.approx([30.0, 30.0])  # 0.5 × 20 × 3 nodes


def test_two_linear_nodes_fill_the_flatter_one_first() -> None:
    pieces = concat([hull_pieces(LINEAR_20, 10), hull_pieces(LINEAR_10, 10)])
    watts = fill_cheapest_first(np.array([0.0, 5.0, 10.0, 15.0, 20.0, 30.0]), pieces)
    # 10 W per core up to 10 cores, then 20 W per core up to 20; beyond full load nothing more
    assert watts.tolist() == pytest.approx([0.0, 50.0, 100.0, 200.0, 300.0, 300.0])


def test_request_aware_never_below_fluid() -> None:
    rng = np.random.default_rng(1)
    curves = [np.sort(rng.uniform(40, 400, size=11)) for _ in range(6)]
    cores = [int(rng.integers(8, 129)) for _ in curves]
    speeds = [float(rng.uniform(0.7, 1.2)) for _ in curves]
    counts = [int(rng.integers(1, 4)) for _ in curves]
    pieces = concat([hull_pieces(c, n, s, k) for c, n, s, k in zip(curves, cores, speeds, counts, strict=True)])
    rate = rng.uniform(0, pieces.capacity.sum() * 1.1, size=500)
    phi = rng.uniform(0.05, 1, size=500)
    aware = fill_nodes_by_requests(rate, phi, curves, cores, speeds, counts)
    assert np.all(aware >= fill_cheapest_first(rate, pieces) - 1e-9)


def test_filling_whole_nodes_by_requests_takes_the_cheapest_node_first_on_its_real_curve() -> None:
    # Two types, one node each, 10 cores, speed 1. "cheap" adds 2 W per busy core, "dear" 5 W.
    cheap = [10.0 + 2.0 * c for c in range(0, 11)]
    dear = [20.0 + 5.0 * c for c in range(0, 11)]
    # phi 0.5: a node full of requests runs 5 cores busy. 7 cores of work: 5 on cheap (10 W),
    # the remaining 2 on dear at its real curve point (10 W).
    watts = fill_nodes_by_requests(np.array([7.0]), np.array([0.5]), [dear, cheap], [10, 10], [1, 1], [1, 1])
    assert watts.tolist() == pytest.approx([20.0])
    # beyond both nodes' phi share (10 cores): the rest above phi, cheapest first
    beyond = fill_nodes_by_requests(np.array([12.0]), np.array([0.5]), [dear, cheap], [10, 10], [1, 1], [1, 1])
    assert beyond.tolist() == pytest.approx([10.0 + 25.0 + 2 * 2.0])


def test_filling_by_requests_is_never_below_the_fluid_hull() -> None:
    rng = np.random.default_rng(7)
    curves = [np.cumsum(np.r_[50.0, rng.uniform(1, 40, 10)]) for _ in range(4)]
    cores, speeds, counts = [64, 128, 48, 256], [1.0, 0.9, 0.8, 1.05], [3, 2, 4, 1]
    pieces = concat([hull_pieces(c, n, s, k) for c, n, s, k in zip(curves, cores, speeds, counts, strict=True)])
    rate = rng.uniform(0, 600, 300)
    phi = rng.uniform(0.3, 1.0, 300)
    aware = fill_nodes_by_requests(rate, phi, curves, cores, speeds, counts)
    assert np.all(aware >= fill_cheapest_first(rate, pieces) - 1e-6)
