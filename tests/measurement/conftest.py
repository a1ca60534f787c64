"""Fixtures for the measurement tests: replica kernel trees and a clock the test drives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from joulesched.measurement.sources.base import Roots
from tests.measurement.agent_server_support import Running, start
from tests.measurement.fakes import FakeClock
from tests.measurement.replica import CgroupTree, PowercapTree, ProcTree


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


@pytest.fixture
def running(tmp_path: Path, clock: FakeClock) -> Iterator[Running]:
    """An agent serving HTTP on loopback (no token)."""
    r = start(tmp_path, clock)
    yield r
    r.server.shutdown()
    r.server.server_close()


@pytest.fixture
def with_token(tmp_path: Path, clock: FakeClock) -> Iterator[Running]:
    """An agent serving HTTP on loopback with a token (``s3cret``)."""
    r = start(tmp_path, clock, token="s3cret")
    yield r
    r.server.shutdown()
    r.server.server_close()
