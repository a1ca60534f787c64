"""Helpers shared by the test folders: a clock the test moves, and a free loopback port."""

from __future__ import annotations

from joulesched.contracts.net import free_port


class Clock:
    """A clock that moves only when the test says so (``now`` is read by calling it)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now


__all__ = ["Clock", "free_port"]
