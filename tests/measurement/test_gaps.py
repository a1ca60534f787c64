"""The gap rule of docs/agent.md, every length, with load changes inside the gap.

A node whose true power is P = 100 W + 50 W per busy core, read by a BMC-like power zone or a
RAPL counter on a replica powercap tree, CPU time from a replica /proc/stat. The zone is
unreadable for a while (the BMC silent, or the RAPL file gone and back reset) while the load
changes. Truth is the energy the node drew; what the agent exports is measured + estimated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from joulesched.measurement.config import AgentConfig, ModelConfig, SourcesConfig
from joulesched.measurement.sampler import Sampler
from joulesched.measurement.snapshot import Snapshot
from joulesched.measurement.sources.base import Roots, Source
from joulesched.measurement.sources.procfs_stat import ProcStat
from joulesched.measurement.sources.registry import open_sources
from tests.measurement.fakes import FakeClock, FakeSource, FakeZone
from tests.measurement.replica import PowercapTree, ProcTree

IDLE_W, PER_CORE_W, CPUS = 100.0, 50.0, 8
ENTRY = "intel-rapl:0"
# busy cores while the model learns, each held 5 s (a BMC's reading is an instant: between two the
# meter integrates a straight line, so each step costs half a step's energy for one interval)
LEARN = [c for c in (0.5, 1.0, 2.0, 3.0, 4.0, 1.5, 0.0, 2.5, 3.5, 1.0) for _ in range(5)]


def power(cores: float) -> float:
    return IDLE_W + PER_CORE_W * cores


@dataclass
class Rig:
    clock: FakeClock
    proc: ProcTree
    sampler: Sampler
    bmc: FakeZone | None = None
    powercap: PowercapTree | None = None
    truth: float = 0.0
    busy: float = 0.0
    idle: float = 0.0
    snaps: list[Snapshot] = field(default_factory=list)

    def second(self, cores: float, readable: bool = True) -> Snapshot:
        """One second at ``cores`` busy cores; then a sample."""
        self.clock.tick()
        watts = power(cores)
        self.truth += watts
        self.busy += cores
        self.idle += CPUS - cores
        self.proc.set_stat(self.busy, self.idle)
        if self.bmc is not None:
            self.bmc.value = watts
            self.bmc.fail = "" if readable else "ipmi_dcmi (BMC 10.0.0.5:623): no answer within 15 s"
        if self.powercap is not None and readable:  # unreadable: the test keeps the counter itself
            self.powercap.advance(ENTRY, watts)
        snap = self.sampler.sample()
        self.snaps.append(snap)
        return snap

    def exported(self, zone: str) -> tuple[float, float]:
        z = next(z for z in self.snaps[-1].zones if z.zone == zone)
        return z.joules_total, z.estimated_joules_total


def _config(roots: Roots, order: tuple[str, ...]) -> AgentConfig:
    return AgentConfig(
        roots=roots,
        sources=SourcesConfig(order=order, rescan_seconds=1e6),
        model=ModelConfig(window_samples=300, min_samples=10, min_spread_cores=0.5),
    )


def bmc_rig(roots: Roots, clock: FakeClock, proc: ProcTree) -> Rig:
    zone = FakeZone("platform", "platform", "power", clock, power(0.0))
    sampler = Sampler(
        _config(roots, ("ipmi_dcmi",)),
        [FakeSource("ipmi_dcmi", [zone])],
        node="n1",
        clock=clock,
        procstat=ProcStat(roots.procfs),
    )
    return Rig(clock, proc, sampler, bmc=zone)


def rapl_rig(roots: Roots, clock: FakeClock, proc: ProcTree, powercap: PowercapTree) -> Rig:
    powercap.add(ENTRY, "package-0", energy_uj=10_000_000_000)
    sources: list[Source] = list(open_sources(("rapl_sysfs",), {}, roots, clock).sources)
    sampler = Sampler(_config(roots, ("rapl_sysfs",)), sources, node="n1", clock=clock, procstat=ProcStat(roots.procfs))
    return Rig(clock, proc, sampler, powercap=powercap)


def learn_then_measure_from_now(rig: Rig) -> tuple[float, float, float]:
    """Run the learning stretch; return (truth, measured, estimated) at its end, the baseline."""
    rig.second(0.0)
    for cores in LEARN:
        rig.second(cores)
    measured, estimated = rig.exported("platform" if rig.bmc is not None else "package-0")
    return rig.truth, measured, estimated


@pytest.mark.parametrize("gap", [1, 10, 30, 60])
def test_a_bmc_gap_with_a_load_step_inside_is_within_2_percent_and_marked(
    roots: Roots, clock: FakeClock, proc: ProcTree, gap: int
) -> None:
    rig = bmc_rig(roots, clock, proc)
    truth0, measured0, estimated0 = learn_then_measure_from_now(rig)
    assert estimated0 == 0.0
    for _ in range(10):
        rig.second(2.0)
    for i in range(gap):  # 200 W, then 500 W halfway through the gap
        rig.second(2.0 if i < gap // 2 else 8.0, readable=False)
    for _ in range(40):  # back: read again within one backoff period
        rig.second(3.0)
    measured, estimated = rig.exported("platform")
    truth = rig.truth - truth0
    got = (measured - measured0) + (estimated - estimated0)
    if gap > 1:
        assert got == pytest.approx(truth, rel=0.02), (got, truth, estimated)
    snap = rig.snaps[-1]
    assert snap.node_energy_total["ipmi_dcmi"] == pytest.approx(measured + estimated, rel=1e-9), (
        "the node total (and so pods and domains) includes the estimate"
    )
    if gap <= 1:
        # readings up to max_gap_seconds (2.5 s) apart are integrated, measured: a step inside is
        # seen as a straight line, wrong by at most the step times the spacing
        assert estimated == 0.0
        assert abs(got - truth) <= (power(8.0) - power(2.0)) * 2.5
    else:
        assert estimated > 0.0
        assert sum(sec for *_, sec in snap.estimated) >= gap
        assert not snap.discarded, "nothing the model could estimate is left discarded"


def test_a_rapl_counter_gap_costs_nothing_and_a_reset_inside_it_is_estimated(
    roots: Roots, clock: FakeClock, proc: ProcTree, powercap: PowercapTree
) -> None:
    rig = rapl_rig(roots, clock, proc, powercap)
    truth0, measured0, _ = learn_then_measure_from_now(rig)
    path = powercap.base / ENTRY / "energy_uj"
    # 20 s unreadable at 2 → 6 cores: the counter still counts, the catch-up is measured exactly
    energy = powercap.energy(ENTRY)
    for i in range(20):
        path.write_text("garbled\n")
        rig.second(2.0 if i < 10 else 6.0, readable=False)
        energy += round(power(2.0 if i < 10 else 6.0) * 1e6)
    powercap.set(ENTRY, energy)
    for _ in range(40):
        rig.second(1.0)
    measured, estimated = rig.exported("package-0")
    assert measured - measured0 == pytest.approx(rig.truth - truth0, rel=1e-9)
    assert estimated == 0.0

    # now it vanishes for 30 s and comes back reset: the interval is estimated, not lost
    truth1, measured1 = rig.truth, measured
    for i in range(30):
        path.unlink(missing_ok=True)
        rig.second(1.0 if i < 15 else 5.0, readable=False)
    powercap.set(ENTRY, 0)
    for _ in range(40):
        rig.second(2.0)
    measured, estimated = rig.exported("package-0")
    got = measured - measured1 + estimated
    assert estimated > 0.0 and got == pytest.approx(rig.truth - truth1, rel=0.02), (got, rig.truth - truth1)
    assert ("rapl_sysfs", "package-0", "reset") in {(s, z, k) for s, z, k, _ in rig.snaps[-1].estimated}


def test_without_a_model_yet_a_gap_stays_discarded_and_is_exported(
    roots: Roots, clock: FakeClock, proc: ProcTree
) -> None:
    rig = bmc_rig(roots, clock, proc)
    for _ in range(3):  # fewer clean intervals than model.min_samples
        rig.second(1.0)
    for _ in range(20):
        rig.second(1.0, readable=False)
    for _ in range(35):
        rig.second(1.0)
    measured, estimated = rig.exported("platform")
    assert estimated == 0.0
    assert measured < rig.truth, "never invented"
    assert sum(sec for *_, sec in rig.snaps[-1].discarded) >= 20


def test_a_window_across_a_gap_reports_its_estimated_part(roots: Roots, clock: FakeClock, proc: ProcTree) -> None:
    rig = bmc_rig(roots, clock, proc)
    learn_then_measure_from_now(rig)
    window = rig.sampler.open_window("across")
    truth0 = rig.truth
    for _ in range(20):
        rig.second(2.0, readable=False)
    for _ in range(35):
        rig.second(2.0)
    result = rig.sampler.close_window(window.id)
    truth = rig.truth - truth0
    assert result["joules"]["node"] == pytest.approx(truth, rel=0.02)
    assert 0 < result["estimated_joules"]["node"] <= result["joules"]["node"]
    assert result["estimated_joules"]["zones"]["ipmi_dcmi/platform"] == result["estimated_joules"]["node"]


def test_the_gauge_is_absent_during_a_gap_not_zero(roots: Roots, clock: FakeClock, proc: ProcTree) -> None:
    rig = bmc_rig(roots, clock, proc)
    learn_then_measure_from_now(rig)
    assert rig.snaps[-1].node_power_watts is not None
    for _ in range(10):
        snap = rig.second(2.0, readable=False)
    assert snap.node_power_watts is None
    assert next(z for z in snap.zones if z.zone == "platform").watts is None
    for _ in range(40):
        snap = rig.second(2.0)
    assert snap.node_power_watts == pytest.approx(power(2.0))


@pytest.mark.parametrize("bad", [65535.0, -1.0, float("nan"), float("inf")], ids=["0xFFFF", "negative", "NaN", "infinite"])
def test_an_impossible_power_reading_is_bridged_from_the_last_good_one_and_counted(clock: FakeClock, bad: float) -> None:
    # A BMC answers one reading no server draws (0xFFFF while it resets, NaN through a Redfish
    # JSON): the meter integrates from the last good reading to the next, never from the bad
    # one, and counts a garbage anomaly. Before, the interval after a 65,535 W reading added
    # 32 kJ of "measured" energy, and a NaN raised out of the meter.
    from joulesched.measurement.meter import EnergyMeter

    zone = FakeZone("platform", "platform", "power", clock, 300.0)
    meter = EnergyMeter([FakeSource("ipmi_dcmi", [zone])], clock=clock)
    key = ("ipmi_dcmi", "platform")
    meter.read()
    for watts in (300.0, bad, 300.0, 300.0):
        clock.tick(1.0)
        zone.value = watts
        meter.read()
    assert meter.read().totals[key] / 1e9 == pytest.approx(4 * 300.0)
    assert meter.anomalies == {("ipmi_dcmi", "platform", "garbage"): 1}


def test_a_first_reading_that_is_impossible_is_counted_and_not_read_from(clock: FakeClock) -> None:
    from joulesched.measurement.meter import EnergyMeter

    zone = FakeZone("platform", "platform", "power", clock, float("nan"))
    meter = EnergyMeter([FakeSource("ipmi_dcmi", [zone])], clock=clock)
    key = ("ipmi_dcmi", "platform")
    meter.read()
    assert not meter.basis_reading()  # only garbage read: the node's power is not known
    for watts in (300.0, 300.0):
        clock.tick(1.0)
        zone.value = watts
        meter.read()
    assert meter.read().totals[key] / 1e9 == pytest.approx(300.0)
    assert meter.anomalies == {("ipmi_dcmi", "platform", "garbage"): 1}
    assert meter.basis_reading()
