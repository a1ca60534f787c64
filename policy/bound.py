"""Cheapest-watts-first maths over power curves: lower convex hulls and fluid filling.

A node's power curve is given at ``CURVE_POINTS`` utilisations 0, 0.1, … 1. Running at a
utilisation between two curve points part of the time and at another the rest of the time
draws, on average, any point of the chord between them, so in a fluid sense a node can draw its
curve's *lower convex hull*. Along the hull the marginal watts per unit of work only grow, so
the least power that serves a given rate of work on a set of nodes is found by cutting every
hull into its linear pieces and filling the pieces cheapest first.

Units: work is in reference-core-seconds (a core of speed 1.0 busy for one second), so a work
*rate* is in reference cores. A node of ``cores`` logical CPUs and relative ``speed`` s serves
work at s reference cores per busy core: its capacity is ``cores × s``, and a hull piece of
slope ``k`` watts per unit utilisation costs ``k / (cores × s)`` watts per reference core.

Pure numpy; nothing here knows about pods or a simulation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

CHUNK_ROWS = 4096  # rows of a (times × pieces) matrix filled at once


def lower_convex_hull(x: npt.ArrayLike, y: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    """The vertices of the lower convex hull of the points ``(x, y)``, ``x`` increasing.

    Both end points are always vertices. Collinear middle points are dropped.
    """
    xs = np.asarray(x, dtype=float)
    ys = np.asarray(y, dtype=float)
    if xs.ndim != 1 or xs.shape != ys.shape or len(xs) < 2:
        raise ValueError("lower_convex_hull: need two or more (x, y) points of equal length")
    if np.any(np.diff(xs) <= 0):
        raise ValueError("lower_convex_hull: x must increase")
    tol = 1e-12 * float((xs[-1] - xs[0]) * max(float(np.ptp(ys)), 1.0))  # collinear up to rounding
    hull: list[int] = []
    for i in range(len(xs)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # drop b when it lies on or above the chord from a to i
            cross = (xs[b] - xs[a]) * (ys[i] - ys[a]) - (ys[b] - ys[a]) * (xs[i] - xs[a])
            if cross <= tol:
                hull.pop()
            else:
                break
        hull.append(i)
    idx = np.asarray(hull, dtype=int)
    return xs[idx], ys[idx]


def curve_utilisations(points: int) -> FloatArray:
    return np.linspace(0.0, 1.0, points)


@dataclass(frozen=True)
class Pieces:
    """Linear pieces of hulls: each serves up to ``capacity`` reference cores at ``cost`` W each.

    ``start`` and ``width`` are the piece's utilisation interval on its own node's curve, and
    ``scale`` the reference cores per unit of utilisation (cores × speed × node count), so a
    cap on utilisation ``φ`` leaves ``scale × clip(φ − start, 0, width)`` of it.
    """

    cost: FloatArray  # W per reference core (marginal watts per unit work rate)
    capacity: FloatArray  # reference cores
    start: FloatArray
    width: FloatArray
    scale: FloatArray

    def capped(self, phi: FloatArray) -> FloatArray:
        """Capacity of every piece when each node may run at most ``phi`` of its cores, per row of ``phi``."""
        p = np.asarray(phi, dtype=float)[:, None]
        return self.scale[None, :] * np.clip(p - self.start[None, :], 0.0, self.width[None, :])


def hull_pieces(curve_watts: Sequence[float], cores: float, speed: float = 1.0, count: int = 1) -> Pieces:
    """The pieces of one node type's hull (``count`` identical nodes), in hull order."""
    if cores <= 0 or speed <= 0 or count < 0:
        raise ValueError("hull_pieces: cores and speed must be > 0, count >= 0")
    u, w = lower_convex_hull(curve_utilisations(len(curve_watts)), curve_watts)
    width = np.diff(u)
    slope = np.diff(w) / width
    per_u = float(cores * speed)
    return Pieces(
        cost=slope / per_u,
        capacity=width * per_u * count,
        start=u[:-1].copy(),
        width=width,
        scale=np.full(len(width), per_u * count),
    )


def linear_pieces(watts_per_unit: float, capacity: float) -> Pieces:
    """One piece: a resource whose power grows linearly up to ``capacity`` units (GPUs)."""
    return Pieces(
        cost=np.array([float(watts_per_unit)]),
        capacity=np.array([float(capacity)]),
        start=np.zeros(1),
        width=np.ones(1),
        scale=np.array([float(capacity)]),
    )


def concat(pieces: Sequence[Pieces]) -> Pieces:
    """All pieces of several node types, sorted cheapest first (ties keep their order)."""
    if not pieces:
        z = np.zeros(0)
        return Pieces(z, z, z, z, z)
    cost = np.concatenate([p.cost for p in pieces])
    order = np.argsort(cost, kind="stable")
    return Pieces(
        cost=cost[order],
        capacity=np.concatenate([p.capacity for p in pieces])[order],
        start=np.concatenate([p.start for p in pieces])[order],
        width=np.concatenate([p.width for p in pieces])[order],
        scale=np.concatenate([p.scale for p in pieces])[order],
    )


def fill_cheapest_first(rate: FloatArray, pieces: Pieces) -> FloatArray:
    """Dynamic watts (above idle) that serve each ``rate`` with fixed capacities, cheapest first.

    Work beyond the total capacity is served at no further cost (a node past full load draws
    its full-load power and is not slowed, as in the simulator's power model).
    """
    r = np.asarray(rate, dtype=float)
    order = np.argsort(pieces.cost, kind="stable")
    cap = pieces.capacity[order]
    cum_cap = np.concatenate([[0.0], np.cumsum(cap)])
    cum_watts = np.concatenate([[0.0], np.cumsum(cap * pieces.cost[order])])
    return np.asarray(np.interp(r, cum_cap, cum_watts), dtype=float)


def fill_in_order(rate: FloatArray, cost: FloatArray, capacity: FloatArray) -> FloatArray:
    """Dynamic watts serving each ``rate[t]`` by the pieces in the given order, with per-row capacities.

    ``capacity`` is (times × pieces); ``cost`` is (pieces,). Work beyond a row's total is free,
    as in :func:`fill_cheapest_first`.
    """
    r = np.asarray(rate, dtype=float)
    out = np.empty(len(r))
    for lo in range(0, len(r), CHUNK_ROWS):
        cap = capacity[lo : lo + CHUNK_ROWS]
        before = np.cumsum(cap, axis=1) - cap
        used = np.clip(r[lo : lo + CHUNK_ROWS, None] - before, 0.0, cap)
        out[lo : lo + CHUNK_ROWS] = used @ cost
    return out


def fill_capped(rate: FloatArray, phi: FloatArray, pieces: Pieces) -> FloatArray:
    """Cheapest first when each node may run at most ``phi[t]`` of its cores; the rest after.

    Work that does not fit under the cap goes on the capacity above it, again cheapest first,
    so the result is never below :func:`fill_cheapest_first` for the same pieces.
    """
    ordered = concat([pieces])
    below = ordered.capped(np.asarray(phi, dtype=float))
    above = ordered.capacity[None, :] - below
    cost = np.concatenate([ordered.cost, ordered.cost])
    return fill_in_order(rate, cost, np.concatenate([below, above], axis=1))


__all__ = [
    "Pieces",
    "concat",
    "curve_utilisations",
    "fill_capped",
    "fill_cheapest_first",
    "fill_in_order",
    "hull_pieces",
    "linear_pieces",
    "lower_convex_hull",
]
