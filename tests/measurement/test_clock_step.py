"""A step of the system clock (NTP setting it at boot, an administrator) mid-run.

The agent stamps every reading with a :class:`SteadyClock` (measurement/clock.py): the wall clock
read once plus the monotonic time since. Here both system clocks are fakes: each second of the
node moves both; a step moves the wall clock only. Truth is the energy the node drew. Each
scenario is also run with the wall clock itself as the agent's clock (how the agent stamped before)
to show what the step did to the figures then.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from joulesched.measurement.clock import SteadyClock, clock_step, wall_clock
from joulesched.measurement.config import AgentConfig, ModelConfig, ServerConfig, SourcesConfig
from joulesched.measurement.exporters.profile import profile_document
from joulesched.measurement.exporters.prometheus import families
from joulesched.measurement.sampler import Sampler
from joulesched.measurement.snapshot import Snapshot
from joulesched.measurement.sources.base import Roots, Source
from joulesched.measurement.sources.procfs_stat import ProcStat
from joulesched.measurement.sources.registry import open_sources
from tests.measurement.fakes import FakeSource, FakeZone
from tests.measurement.replica import PowercapTree, ProcTree
from tests.support import Clock

WATTS = 300.0
HOUR = 3600.0
START = 1_764_400_000.0
ENTRY = "intel-rapl:0"


class System:
    """The host's two clocks: ``second()`` moves both, ``step()`` the wall clock only."""

    def __init__(self) -> None:
        self.wall = Clock(START)
        self.mono = Clock(5_000.0)  # seconds since boot

    def second(self, seconds: float = 1.0) -> None:
        self.wall.tick(seconds)
        self.mono.tick(seconds)

    def step(self, seconds: float) -> None:
        self.wall.tick(seconds)


def test_the_steady_clock_keeps_counting_through_a_step_and_says_how_far_the_wall_clock_moved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    system = System()
    clock = SteadyClock(system.wall, system.mono)
    assert clock() == START and clock.step() == 0.0
    system.second(2.0)
    system.step(0.3)  # within the tolerance: two reads are not one instant
    assert clock() == START + 2.0 and clock.step() == 0.0
    with caplog.at_level(logging.WARNING, logger="joulesched.measurement.clock"):
        system.step(HOUR - 0.3)
        system.second()
        assert clock() == START + 3.0, "a step of the wall clock is not a step of the agent's"
        assert clock.step() == HOUR and clock.step() == HOUR
        assert wall_clock(clock)() == system.wall()
        system.step(-2 * HOUR)  # set back past where it started
        assert clock.step() == -HOUR and clock_step(clock) == -HOUR
    assert clock.steps == 2
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "the system clock was stepped by +3600.000 s",
        "the system clock was stepped by -7200.000 s",
    ], "each step is logged once"
    fake = Clock(START)
    assert clock_step(fake) == 0.0 and wall_clock(fake) is fake, "a plain clock has no step and is its own wall time"


def _config(roots: Roots, order: tuple[str, ...], state_dir: str = "") -> AgentConfig:
    return AgentConfig(
        roots=roots,
        sources=SourcesConfig(order=order, rescan_seconds=1e6),
        model=ModelConfig(window_samples=300, min_samples=10, min_spread_cores=0.5),
        server=ServerConfig(state_dir=state_dir),
    )


class Node:
    """A node drawing WATTS (1 or 3 busy cores of 8 in turn), read by a BMC-like power zone or a
    RAPL counter."""

    def __init__(
        self,
        roots: Roots,
        system: System,
        clock: Callable[[], float],
        kind: str,
        powercap: PowercapTree | None = None,
        state_dir: str = "",
    ) -> None:
        self.system = system
        self.proc = ProcTree(Path(roots.procfs), cpus=8)
        self.busy = self.idle = 0.0
        self.proc.set_stat(0.0, 0.0)
        self.bmc: FakeZone | None = None
        self.powercap = powercap if kind == "rapl" else None
        sources: list[Source]
        if kind == "bmc":
            self.bmc = FakeZone("platform", "platform", "power", clock, WATTS)
            sources, order = [FakeSource("ipmi_dcmi", [self.bmc])], ("ipmi_dcmi",)
        else:
            assert powercap is not None
            powercap.add(ENTRY, "package-0", energy_uj=10_000_000_000)
            sources, order = list(open_sources(("rapl_sysfs",), {}, roots, clock).sources), ("rapl_sysfs",)
        self.sampler = Sampler(
            _config(roots, order, state_dir), sources, node="n1", clock=clock, procstat=ProcStat(roots.procfs)
        )
        self.zone = "platform" if kind == "bmc" else "package-0"
        self.snaps: list[Snapshot] = [self.sampler.sample()]

    def second(self) -> Snapshot:
        self.system.second()
        cores = 1.0 + 2.0 * (len(self.snaps) % 2)
        self.busy += cores
        self.idle += 8.0 - cores
        self.proc.set_stat(self.busy, self.idle)
        if self.powercap is not None:
            self.powercap.advance(ENTRY, WATTS)
        snap = self.sampler.sample()
        self.snaps.append(snap)
        return snap

    def energy(self) -> tuple[float, float]:
        """(measured, estimated) joules of the zone so far."""
        z = next(z for z in self.snaps[-1].zones if z.zone == self.zone)
        return z.joules_total, z.estimated_joules_total


def _run_across_a_step(node: Node, step: float) -> tuple[float, float, float, Snapshot]:
    """20 s, the step, 20 s more; (true joules, measured, estimated, the last snapshot)."""
    for _ in range(20):
        node.second()
    node.system.step(step)
    for _ in range(20):
        node.second()
    measured, estimated = node.energy()
    return WATTS * 40, measured, estimated, node.snaps[-1]


@pytest.mark.parametrize("step", [HOUR, -HOUR], ids=["set ahead", "set back"])
@pytest.mark.parametrize("kind", ["bmc", "rapl"])
def test_a_step_of_the_system_clock_changes_no_energy(
    roots: Roots, powercap: PowercapTree, kind: str, step: float
) -> None:
    system = System()
    clock = SteadyClock(system.wall, system.mono)
    truth, measured, estimated, snap = _run_across_a_step(Node(roots, system, clock, kind, powercap), step)
    assert measured == pytest.approx(truth, rel=1e-6) and estimated == 0.0
    assert not snap.anomalies and not snap.discarded and not snap.estimated, "the step is no gap"
    assert snap.node_power_watts == pytest.approx(WATTS, rel=1e-6)
    # what leaves the agent as a time of day is the system clock's
    assert snap.clock_step == step and snap.wall_time == system.wall()
    assert profile_document(snap)["nodes"][0]["updated"] == system.wall()
    gauge = next(m for m in families(snap) if m.name == "joulesched_agent_clock_step_seconds")
    assert [s.value for s in gauge.samples] == [step]


@pytest.mark.parametrize(
    ("step", "kind", "what"),
    [
        (HOUR, "bmc", "an hour estimated for one second"),
        (-HOUR, "bmc", "a second dropped"),
        (-HOUR, "rapl", "a counter delta dropped"),
    ],
)
def test_with_the_wall_clock_as_the_agents_the_same_step_changed_the_energy(
    roots: Roots, powercap: PowercapTree, step: float, kind: str, what: str
) -> None:
    """What a step did when the agent stamped with ``time.time``: the scenario above can fail."""
    system = System()
    truth, measured, estimated, snap = _run_across_a_step(Node(roots, system, system.wall, kind, powercap), step)
    assert snap.anomalies, what
    assert measured + estimated != pytest.approx(truth, rel=1e-3), what


def test_a_window_across_a_step_reports_wall_times_and_its_real_length(roots: Roots, tmp_path: Path) -> None:
    system = System()
    clock = SteadyClock(system.wall, system.mono)
    node = Node(roots, system, clock, "bmc", state_dir=str(tmp_path / "state"))
    window = node.sampler.open_window("job")
    opened_at = system.wall()
    for _ in range(10):
        node.second()
    system.step(-HOUR)
    for _ in range(10):
        node.second()
    saved = json.loads((tmp_path / "state" / "windows.json").read_text())
    assert saved["windows"][0]["start"] == opened_at - HOUR, "the store holds wall time as the system clock has it now"
    assert saved["saved"] == system.wall()
    result = node.sampler.close_window(window.id)
    assert result["start"] == opened_at - HOUR and result["end"] == system.wall()
    assert result["seconds"] == 20.0
    assert result["joules"]["node"] == pytest.approx(WATTS * 20, rel=1e-6)


def test_the_next_run_reads_the_stored_window_in_its_own_terms(roots: Roots, tmp_path: Path) -> None:
    """A window opened before a step and carried over a restart keeps its energy and its times."""
    state = str(tmp_path / "state")
    system = System()
    node = Node(roots, system, SteadyClock(system.wall, system.mono), "bmc", state_dir=state)
    window = node.sampler.open_window("job")
    opened_at = system.wall()
    for _ in range(10):
        node.second()
    system.step(HOUR)
    for _ in range(5):
        node.second()
    system.second(30.0)  # the agent restarts; the new one starts its clock afresh
    node2 = Node(roots, system, SteadyClock(system.wall, system.mono), "bmc", state_dir=state)
    for _ in range(5):
        node2.second()
    result = node2.sampler.close_window(window.id)
    assert result["start"] == opened_at + HOUR
    assert result["end"] == system.wall()
    restarted = result["restarted"]
    assert restarted["last_saved"] == system.wall() - 35.0, "saved at the last sample before the restart"
    assert restarted["seconds_lost"] == pytest.approx(30.0), "the power zone's downtime, and nothing of the step"
