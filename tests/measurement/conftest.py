"""Fixtures for the measurement tests: replica kernel trees and a clock the test drives."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from replica import CgroupTree, PowercapTree, ProcTree

from measurement.sources.base import Roots


class FakeClock:
    """A clock that moves only when the test says so."""

    def __init__(self, start: float = 1_764_400_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def roots(tmp_path: Path) -> Roots:
    return Roots(
        sysfs=str(tmp_path / "sys"),
        procfs=str(tmp_path / "proc"),
        cgroup=str(tmp_path / "cgroup"),
        dev=str(tmp_path / "dev"),
    )


@pytest.fixture
def powercap(roots: Roots) -> PowercapTree:
    return PowercapTree(Path(roots.sysfs))


@pytest.fixture
def proc(roots: Roots) -> ProcTree:
    return ProcTree(Path(roots.procfs), cpus=8)


@pytest.fixture
def cgroup(roots: Roots) -> CgroupTree:
    return CgroupTree(Path(roots.cgroup), version=2, driver="systemd")
