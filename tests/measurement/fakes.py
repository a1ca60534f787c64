"""Small in-memory sources for tests that need a whole-server reading or GPUs next to RAPL."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from joulesched.measurement.errors import SourceFailed
from joulesched.measurement.sources.base import Reading, ReadingKind
from tests.support import Clock


@dataclass
class FakeZone:
    name: str
    domain: str
    kind: ReadingKind
    clock: Callable[[], float]
    value: float = 0.0
    max_joules: float | None = None
    parent: str | None = None
    fail: str = ""

    def read(self) -> Reading:
        if self.fail:
            raise SourceFailed(self.fail)
        return Reading(self.value, self.clock())


@dataclass
class FakeSource:
    name: str
    zone_list: list[FakeZone] = field(default_factory=list)

    def zones(self) -> Sequence[FakeZone]:
        return list(self.zone_list)

    def zone(self, name: str) -> FakeZone:
        return next(z for z in self.zone_list if z.name == name)


@dataclass
class FakeGpus(FakeSource):
    """An NVML-like source: counter zones gpu-N plus per-process SM use."""

    processes: dict[int, dict[str, float]] = field(default_factory=dict)
    limits: dict[str, float] = field(default_factory=dict)

    def process_utilisation(self) -> dict[int, dict[str, float]]:
        return {pid: dict(use) for pid, use in self.processes.items()}

    def power_limits(self) -> dict[str, float]:
        return dict(self.limits)


def ipmi(clock: Callable[[], float], watts: float = 0.0) -> FakeSource:
    return FakeSource("ipmi_dcmi", [FakeZone("chassis", "platform", "power", clock, watts)])


def gpus(clock: Callable[[], float], count: int = 2) -> FakeGpus:
    return FakeGpus("nvml", [FakeZone(f"gpu-{i}", "gpu", "counter", clock) for i in range(count)])




class FakeClock(Clock):
    """:class:`tests.support.Clock` starting in late 2025, as the agent's tests read it."""

    def __init__(self, start: float = 1_764_400_000.0) -> None:
        super().__init__(start)


__all__ = ["FakeClock", "FakeGpus", "FakeSource", "FakeZone", "gpus", "ipmi"]
