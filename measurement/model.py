"""The node's power model, P(u) = idle + k·u, fitted by least squares over a rolling window.

For the CPU side u is the number of busy cores (busy CPU seconds ÷ interval), P the node's
non-GPU power, so k is watts per fully busy core; for a GPU u is its utilisation 0..1, P its
power, and k the watts a fully busy GPU adds. The fit needs ``min_samples`` samples whose u
spans at least ``min_spread`` (an idle node says nothing about k); until then there is no fit
and the idle estimate is the lowest power seen in the window (as Kepler does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class LinearFit:
    idle_watts: float
    slope_watts: float  # per busy core (CPU) or per fully busy GPU
    r2: float
    samples: int


class RollingFit:
    def __init__(self, window: int, min_samples: int, min_spread: float) -> None:
        if window < 2 or min_samples < 2:
            raise ValueError(f"window ({window}) and min_samples ({min_samples}) must be >= 2")
        self.window = window
        self.min_samples = min(min_samples, window)
        self.min_spread = min_spread
        self._x = np.zeros(window)
        self._y = np.zeros(window)
        self._n = 0
        self._next = 0
        self._fit: LinearFit | None = None
        self._dirty = False

    def add(self, x: float, y: float) -> None:
        if not (np.isfinite(x) and np.isfinite(y)):
            return
        self._x[self._next] = x
        self._y[self._next] = y
        self._next = (self._next + 1) % self.window
        self._n = min(self._n + 1, self.window)
        self._dirty = True

    @property
    def samples(self) -> int:
        return self._n

    def mean_power(self) -> float | None:
        return float(self._y[: self._n].mean()) if self._n else None

    def min_power(self) -> float | None:
        return float(self._y[: self._n].min()) if self._n else None

    def fit(self) -> LinearFit | None:
        """The least-squares line over the window, or None while the data cannot determine it."""
        if not self._dirty:
            return self._fit
        self._dirty = False
        self._fit = None
        n = self._n
        if n < self.min_samples:
            return None
        x, y = self._x[:n], self._y[:n]
        if float(x.max() - x.min()) < self.min_spread:
            return None
        design = np.column_stack((np.ones(n), x))
        (idle, slope), *_ = np.linalg.lstsq(design, y, rcond=None)
        residual = y - (idle + slope * x)
        total = float(((y - y.mean()) ** 2).sum())
        r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0
        self._fit = LinearFit(float(idle), float(slope), r2, n)
        return self._fit

    def idle_estimate(self) -> float:
        """Idle watts for attribution: the fit's intercept when there is a fit (never below 0),
        else the lowest power in the window, else 0."""
        fit = self.fit()
        if fit is not None:
            return max(fit.idle_watts, 0.0)
        low = self.min_power()
        return max(low, 0.0) if low is not None else 0.0


__all__ = ["LinearFit", "RollingFit"]
