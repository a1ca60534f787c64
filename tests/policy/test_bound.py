from __future__ import annotations

import numpy as np
import pytest

from joulesched.policy.bound import (
    concat,
    fill_capped,
    fill_cheapest_first,
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


def test_request_cap_moves_work_to_the_dearer_node() -> None:
    pieces = concat([hull_pieces(LINEAR_10, 10), hull_pieces(LINEAR_20, 10)])
    # half of each node's cores usable: 5 cores at 10 W, then 5 at 20 W, then the rest above the cap
    watts = fill_capped(np.array([7.5, 10.0, 15.0]), np.array([0.5, 0.5, 0.5]), pieces)
    assert watts.tolist() == pytest.approx([100.0, 150.0, 200.0])


def test_request_aware_never_below_fluid() -> None:
    rng = np.random.default_rng(1)
    curves = [np.sort(rng.uniform(40, 400, size=11)) for _ in range(6)]
    pieces = concat([hull_pieces(c, rng.integers(8, 129), rng.uniform(0.7, 1.2), int(rng.integers(1, 4))) for c in curves])
    rate = rng.uniform(0, pieces.capacity.sum() * 1.1, size=500)
    phi = rng.uniform(0, 1, size=500)
    assert np.all(fill_capped(rate, phi, pieces) >= fill_cheapest_first(rate, pieces) - 1e-9)
    # no cap: the same as fluid
    assert fill_capped(rate, np.ones(500), pieces) == pytest.approx(fill_cheapest_first(rate, pieces))
