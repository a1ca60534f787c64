"""Helpers shared by the test folders: a clock the test moves, a free loopback port, and the
real tools a test needs."""

from __future__ import annotations

import os
import shutil

import pytest

from joulesched.contracts.net import free_port


def require(binary: str, installed_by: str) -> str:
    """The path of ``binary``; missing, the test fails in CI (which installs it) and is skipped elsewhere."""
    path = shutil.which(binary)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{binary} is not installed ({installed_by} in CI)")
        pytest.skip(f"{binary} is not installed ({installed_by})")
    return path


class Clock:
    """A clock that moves only when the test says so (``now`` is read by calling it)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now


__all__ = ["Clock", "free_port", "require"]
