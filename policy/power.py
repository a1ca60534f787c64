"""A node's power curve P(u): the one interpolation, and the two rules above u = 1.

A curve is 11 points, the power in watts at utilisation 0 %, 10 %, ..., 100 % (SPECpower's
load levels). Between two points P is linear: with ``x = 10·u`` and ``k = ⌊x⌋`` (at most 9),
``P(u) = P_k + (P_{k+1} − P_k)·(x − k)``; below u = 0 it is P(0).

Above u = 1 (more busy cores than the node has) two different quantities follow from the curve,
and each has its own function:

* :func:`drawn_watts` — the power the node *draws*: a node cannot draw more than P(1), so it
  stays at P(1); the extra work simply takes longer. The simulator's engine integrates this
  (``P = drawn_watts(curve, busy / cores)`` between events).
* :func:`curve_power` — the *cost* of the load, the policy's view: demand beyond capacity is
  time-shared, the work takes u times as long at full power, so the curve continues as
  ``P(1) × u``. A saturated node is then the most expensive place for more work, never a free
  one (clipping would make its marginal power zero and let a full node win every pod of a
  burst). The extender's scoring (:mod:`policy.scoring`) uses this.

For 0 ≤ u ≤ 1 the two are the same number, to the last bit (tests/policy/test_power.py).

A node's GPUs (:func:`gpu_watts`) draw their idle power each, and the busy ones their share of
the span to their maximum: linear in use, as NVML's board power is modelled here. The
simulator's engine and the scoring both call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from joulesched.policy.profile import CURVE_POINTS

_LAST_SEGMENT = CURVE_POINTS - 2  # k is at most 9: u = 1 interpolates the segment [90 %, 100 %]
_SEGMENTS = float(CURVE_POINTS - 1)


def drawn_watts(curve: Sequence[float], utilisation: float) -> float:
    """The power a node draws at ``utilisation``: P(u) on the curve, P(0) below 0, P(1) above 1.

    Scalar and free of numpy, for the simulator's per-event step.
    """
    if utilisation <= 0.0:
        return float(curve[0])
    if utilisation >= 1.0:
        return float(curve[-1])
    x = utilisation * _SEGMENTS
    k = min(int(x), _LAST_SEGMENT)
    return float(curve[k] + (curve[k + 1] - curve[k]) * (x - k))


def gpu_watts(count: Any, idle_watts: Any, max_watts: Any, busy: Any) -> Any:
    """The power of ``count`` GPUs of ``idle_watts``..``max_watts`` each, ``busy`` of them busy
    (GPU-equivalents; at most ``count`` count): ``count × idle + min(busy, count) × (max − idle)``.

    Floats (the simulator's per-event step) or arrays of one value per node (the scoring).
    """
    return count * idle_watts + np.minimum(busy, count) * (max_watts - idle_watts)


def curve_power(curve: np.ndarray, utilisation: np.ndarray) -> np.ndarray:
    """The cost-side P(u) for each row's curve: linear between the 11 points, ``P(1) × u`` above 1.

    ``utilisation`` has one value per row, or shape (k, rows) to evaluate k utilisations of
    every row in one pass. Demand beyond the node's capacity (u > 1) is time-shared: the work
    takes u times as long at full power, so the curve continues as P(1) × u. A saturated node
    is therefore the most expensive place for more work, never a free one (clipping at 1
    would make its marginal power zero and let a full node win every pod of a burst).
    """
    u = np.maximum(utilisation, 0.0)
    x = np.minimum(u, 1.0) * (CURVE_POINTS - 1)
    # fmax maps NaN to 0 for the index only (NaN cast to an integer is INT_MIN, an index far out
    # of range); frac stays NaN, so a NaN utilisation still gives a NaN power, never a crash.
    lo = np.minimum(np.fmax(x, 0.0).astype(np.intp), CURVE_POINTS - 2)
    frac = x - lo
    # Row r's point k is element 11·r + k of the flattened curves: one flat gather a side.
    at = lo + np.arange(0, curve.size, CURVE_POINTS)
    points = curve.reshape(-1)
    left = points[at]
    right = points[at + 1]
    power: np.ndarray = left + (right - left) * frac + np.maximum(u - 1.0, 0.0) * curve[:, CURVE_POINTS - 1]
    return power
