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

from joulesched.policy.power import drawn_watts

FloatArray = npt.NDArray[np.float64]


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
    """Linear pieces of hulls: each serves up to ``capacity`` reference cores at ``cost`` W each."""

    cost: FloatArray  # W per reference core (marginal watts per unit work rate)
    capacity: FloatArray  # reference cores


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
    )


def linear_pieces(watts_per_unit: float, capacity: float) -> Pieces:
    """One piece: a resource whose power grows linearly up to ``capacity`` units (GPUs)."""
    return Pieces(
        cost=np.array([float(watts_per_unit)]),
        capacity=np.array([float(capacity)]),
    )


def concat(pieces: Sequence[Pieces]) -> Pieces:
    """All pieces of several node types, sorted cheapest first (ties keep their order)."""
    if not pieces:
        z = np.zeros(0)
        return Pieces(z, z)
    cost = np.concatenate([p.cost for p in pieces])
    order = np.argsort(cost, kind="stable")
    return Pieces(
        cost=cost[order],
        capacity=np.concatenate([p.capacity for p in pieces])[order],
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


def fill_nodes_by_requests(
    rate: FloatArray,
    phi: FloatArray,
    curves: Sequence[Sequence[float]],
    cores: Sequence[float],
    speeds: Sequence[float],
    counts: Sequence[int],
) -> FloatArray:
    """Dynamic watts when whole nodes are filled with requests, cheapest node first, on the real curves.

    At each instant the pods in flight keep ``phi`` of their requested cores busy, so a node
    full of requests runs at utilisation φ and serves ``φ × cores × speed`` reference cores of
    work, drawing ``P(φ) − P(0)`` above idle. Node types are taken in ascending order of those
    watts per reference core; whole nodes are filled until the rate is served, and the last
    node takes the remainder at its real curve point ``P(x / (cores × speed)) − P(0)``. Work
    beyond every node's φ share (pods using more than they request) is served above φ, again
    cheapest first, up to full load; beyond that it is free (the power model's saturation).

    No time-sharing between utilisation levels (the curve, not its hull), so this is never
    below :func:`fill_cheapest_first` on the same nodes' hulls: what a scheduler that respects
    requests and knows every node's curve could reach, pod fragmentation aside.
    """
    r = np.asarray(rate, dtype=float)
    ph = np.clip(np.asarray(phi, dtype=float), 0.0, 1.0)
    curve = np.asarray(curves, dtype=float)
    per_u = np.asarray(cores, dtype=float) * np.asarray(speeds, dtype=float)  # reference cores at u = 1
    count = np.asarray(counts, dtype=float)
    out = np.zeros(len(r))
    for k in range(len(r)):
        need = r[k]
        if need <= 0.0:
            continue
        f = ph[k] if ph[k] > 0.0 else 1.0
        p_f = np.array([drawn_watts(c, f) for c in curve]) - curve[:, 0]
        cap = f * per_u  # work of one node full of requests
        watts = 0.0
        for j in np.argsort(p_f / cap, kind="stable"):
            if need <= 0.0:
                break
            whole = min(count[j], np.floor(need / cap[j]))
            watts += whole * p_f[j]
            need -= whole * cap[j]
            if need > 1e-12 and whole < count[j]:
                watts += drawn_watts(curve[j], need / per_u[j]) - curve[j, 0]
                need = 0.0
        if need > 1e-12 and f < 1.0:  # above φ: from P(φ) to P(1) on every node, cheapest first
            above_cap = (1.0 - f) * per_u * count
            above_cost = (curve[:, -1] - curve[:, 0] - p_f) / ((1.0 - f) * per_u)
            for j in np.argsort(above_cost, kind="stable"):
                used = min(need, above_cap[j])
                watts += used * above_cost[j]
                need -= used
                if need <= 1e-12:
                    break
        out[k] = watts
    return out


__all__ = [
    "Pieces",
    "concat",
    "curve_utilisations",
    "fill_cheapest_first",
    "fill_nodes_by_requests",
    "hull_pieces",
    "linear_pieces",
    "lower_convex_hull",
]
