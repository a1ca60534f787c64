"""The agent's clock: seconds since the epoch that never step.

Every interval the agent measures — a power zone's trapezoid, a counter's plausibility bound, a
gap's estimate, a pod's CPU time over a sample — is the difference of two stamps from one clock.
``time.time`` steps when NTP sets the system clock (``chronyd``'s ``makestep`` at boot, an
``ntpdate``) or an administrator does: a step back made an exactly known counter delta look
negative and dropped it; a step forward made a BMC's one-second interval look like an hour's gap
and estimated an hour of energy for it.

:class:`SteadyClock` reads the wall clock once, at start, and adds the monotonic time since, so
its intervals are real ones whatever the system clock does (``CLOCK_MONOTONIC`` is slewed by NTP
as the wall clock is, never stepped). What leaves the agent as a time of day — a snapshot's
``updated`` in ``/v1/profile``, the recording's ``t``, a window's ``start`` and ``end``, the
NADIKI samples, the window store, the carbon intensity looked up for now — is wall time:
:meth:`SteadyClock.step` says how far the system clock has been stepped since start, and a stamp
plus the step is the system clock's present view of that moment. A step is logged when it is
first seen and exported as ``joulesched_agent_clock_step_seconds``.

Anything else that is called as ``() -> float`` (the simulator's and the tests' fake clocks)
works as before: it has no step (:func:`clock_step` is 0) and is its own wall time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# A difference between the two clocks smaller than this is not taken for a step: reading both is
# not one instant (a thread can be switched out between the reads), and NTP slews both alike.
STEP_TOLERANCE_SECONDS = 0.5
# Two readings of the wall clock further apart on the monotonic clock than this are read again.
_PAIR_SECONDS = 0.01


class SteadyClock:
    """Wall time at start plus monotonic time since: ``clock()`` for stamps, ``step()`` to export."""

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        tolerance: float = STEP_TOLERANCE_SECONDS,
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self.tolerance = tolerance
        self._base = self._offset()
        self._step = 0.0
        self._lock = threading.Lock()
        self.steps = 0  # steps seen since start

    def _offset(self) -> float:
        """Wall minus monotonic, from a pair of reads close together."""
        offset = 0.0
        for _ in range(3):
            before = self._monotonic()
            wall = self._wall()
            after = self._monotonic()
            offset = wall - (before + after) / 2
            if after - before <= _PAIR_SECONDS:
                break
        return offset

    def __call__(self) -> float:
        return self._monotonic() + self._base

    def step(self) -> float:
        """How far the system clock has been stepped since start (seconds; positive: set ahead).

        A stamp of this clock plus the step is wall time now. The step changes only when the
        system clock moves by more than ``tolerance`` against the monotonic clock."""
        drift = self._offset() - self._base
        with self._lock:
            if abs(drift - self._step) > self.tolerance:
                log.warning(
                    "the system clock was stepped by %+.3f s (%+.3f s since the agent started): intervals stay "
                    "timed on the monotonic clock; exported times follow the system clock",
                    drift - self._step,
                    drift,
                )
                self._step = drift
                self.steps += 1
            return self._step


def clock_step(clock: Callable[[], float]) -> float:
    """The step of ``clock`` since it started: 0 for a clock that has none (a fake one)."""
    return clock.step() if isinstance(clock, SteadyClock) else 0.0


def wall_clock(clock: Callable[[], float]) -> Callable[[], float]:
    """Wall time now, on ``clock``'s terms: its stamp plus its step."""
    if isinstance(clock, SteadyClock):
        return lambda: clock() + clock.step()
    return clock


__all__ = ["STEP_TOLERANCE_SECONDS", "SteadyClock", "clock_step", "wall_clock"]
