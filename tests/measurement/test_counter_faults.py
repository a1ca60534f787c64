"""Counter faults on a replica powercap tree: no energy invented, none dropped unseen.

Each case drives one package zone through a fault and compares the meter's total with the truth
(the energy the replica really added). A wrap is believed only when it fits the counter's range
and the zone's own power over the real time since the counter last changed; whatever is dropped
shows in the anomaly counts and the discarded seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from joulesched.measurement.config import AgentConfig, SourcesConfig
from joulesched.measurement.meter import EnergyMeter
from joulesched.measurement.sampler import Sampler
from joulesched.measurement.sources.base import Roots
from joulesched.measurement.sources.registry import open_sources
from tests.measurement.fakes import FakeClock, FakeSource, FakeZone
from tests.measurement.replica import DEFAULT_MAX_UJ, PowercapTree

ENTRY = "intel-rapl:0"
KEY = ("rapl_sysfs", "package-0")


@dataclass
class Rig:
    tree: PowercapTree
    clock: FakeClock
    meter: EnergyMeter
    truth: float = 0.0  # joules the zone really used while the meter watched

    def read(self) -> float:
        return self.meter.read().totals[KEY] / 1e9

    def run(self, watts: float, seconds: float, every: float = 1.0) -> None:
        """Draw ``watts`` for ``seconds``, reading every ``every`` seconds."""
        steps = round(seconds / every)
        for _ in range(steps):
            self.clock.tick(every)
            self.tree.advance(ENTRY, watts * every)
            self.truth += watts * every
            self.read()

    def unreadable(self, watts: float, seconds: float, content: str | None) -> None:
        """The zone cannot be read for ``seconds`` (``content`` None: the file vanished)."""
        energy = self.tree.energy(ENTRY)
        path = self.tree.base / ENTRY / "energy_uj"
        for _ in range(round(seconds)):
            self.clock.tick()
            self.truth += watts
            if content is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(content)
            self.read()
        self.tree.set(ENTRY, energy)


def plain_wrap(rig: Rig) -> None:
    rig.tree.set(ENTRY, DEFAULT_MAX_UJ - 50_000_000)
    rig.read()
    rig.run(100.0, 5.0)


def wrap_near_the_maximum(rig: Rig) -> None:
    rig.tree.set(ENTRY, DEFAULT_MAX_UJ - 1)
    rig.read()
    rig.run(123.456789, 3.0)


def reset_after_vanish(rig: Rig) -> None:
    rig.tree.set(ENTRY, 100_000_000_000)
    rig.read()
    rig.run(80.0, 10.0)
    rig.unreadable(80.0, 16.0, None)
    rig.tree.set(ENTRY, 1_300_000_000)  # back, reset: 1.3 kJ since the reset
    rig.clock.tick()
    rig.truth += 80.0
    rig.read()
    rig.run(80.0, 5.0)


def backwards_after_unreadable(rig: Rig) -> None:
    rig.tree.set(ENTRY, 100_000_000_000)
    rig.read()
    rig.run(80.0, 10.0)
    rig.unreadable(80.0, 30.0, "garbled\n")
    rig.tree.set(ENTRY, rig.tree.energy(ENTRY) - 1_000_000_000)  # 1 kJ back
    rig.clock.tick()
    rig.truth += 80.0
    rig.read()
    rig.run(80.0, 5.0)


def garbage_then_zero(rig: Rig) -> None:
    rig.tree.set(ENTRY, 256_600_000_000)
    rig.read()
    rig.run(100.0, 5.0)
    for value in (2**64 - 1, 0):
        rig.tree.set(ENTRY, value)
        rig.clock.tick()
        rig.truth += 100.0
        rig.read()
    rig.run(100.0, 3.0)


def coarse_steps_read_often(rig: Rig) -> None:
    """70 J steps every 100 ms; a read every 10 ms, and 8 window clients reading 1 ms apart."""
    rig.read()
    for ms in range(1, 10_001):
        rig.clock.tick(0.001)
        if ms % 100 == 50:
            rig.tree.advance(ENTRY, 70.0)
            rig.truth += 70.0
        if ms % 10 == 0 or ms % 10 in range(1, 9):
            rig.read()


@pytest.mark.parametrize(
    ("scenario", "exact", "kinds"),
    [
        (plain_wrap, True, set()),
        (wrap_near_the_maximum, True, set()),
        (reset_after_vanish, False, {"reset"}),
        (backwards_after_unreadable, False, {"reset"}),
        (garbage_then_zero, False, {"garbage", "reset"}),
        (coarse_steps_read_often, True, set()),
    ],
    ids=[
        "a plain wrap is counted exactly",
        "a wrap near the real maximum is counted exactly",
        "a zone that vanished and came back reset counts as a reset and invents no energy",
        "a counter gone backwards after an unreadable stretch invents no energy",
        "a garbage 2^64-1 then 0 invents no energy",
        "coarse 70 J steps read every few ms lose nothing",
    ],
)
def test_counter_fault(
    roots: Roots,
    powercap: PowercapTree,
    clock: FakeClock,
    scenario: Callable[[Rig], None],
    exact: bool,
    kinds: set[str],
) -> None:
    powercap.add(ENTRY, "package-0")
    # retries at most 1 s apart: every read of the scenario is attempted (backoff is tested apart)
    sources = open_sources(("rapl_sysfs",), {}, roots, clock).sources
    meter = EnergyMeter(sources, clock=clock, rescan_seconds=1e9, retry_max_seconds=1.0)
    rig = Rig(powercap, clock, meter)
    scenario(rig)
    measured = rig.read()
    got = {kind for (_, zone, kind) in meter.anomalies if zone == "package-0"}
    assert got == kinds
    assert measured <= rig.truth + 1e-6  # never invented
    if exact:
        assert measured == pytest.approx(rig.truth, abs=1e-6)
    else:  # dropped, and every dropped second exported
        assert sum(meter.discarded_seconds.values()) > 0
    if scenario is coarse_steps_read_often:
        assert rig.truth - measured <= 70.0


def test_window_traffic_drops_no_energy_of_a_coarse_counter(
    roots: Roots, powercap: PowercapTree, clock: FakeClock
) -> None:
    """8 clients opening and closing windows between samples: 70 J steps every 100 ms all count."""
    powercap.add(ENTRY, "package-0")
    s = Sampler(
        replace(AgentConfig(), roots=roots, sources=SourcesConfig(order=("rapl_sysfs",))),
        open_sources(("rapl_sysfs",), {}, roots, clock).sources,
        node="n1",
        clock=clock,
    )
    s.sample()
    truth = 0.0
    windows: list[str] = []
    for ms in range(1, 5_001):
        clock.tick(0.001)
        if ms % 100 == 50:
            powercap.advance(ENTRY, 70.0)
            truth += 70.0
        if ms % 1000 == 0:
            s.sample()
        elif len(windows) < 8:
            windows.append(s.open_window().id)
        else:
            s.close_window(windows.pop(0))
    snap = s.sample()
    counted = next(z.joules_total for z in snap.zones if z.zone == "package-0")
    assert counted == pytest.approx(truth, abs=1e-6)
    assert snap.anomalies == ()


@pytest.mark.parametrize(
    ("kept_counting", "kinds"),
    [(True, set()), (False, {"reset"})],
    ids=[
        "a zone missing from a re-listing that kept counting loses nothing",
        "a zone back from a re-listing reset counts as a reset",
    ],
)
def test_a_zone_missing_from_a_relisting(
    roots: Roots, powercap: PowercapTree, clock: FakeClock, kept_counting: bool, kinds: set[str]
) -> None:
    """The zone is marked absent at one re-listing and listed again at the next: its next reading
    is differenced against its last one before it went, as after failed reads."""
    powercap.add(ENTRY, "package-0", energy_uj=100_000_000_000)
    powercap.add("intel-rapl:1", "package-1")  # stays: the source keeps reading
    sources = open_sources(("rapl_sysfs",), {}, roots, clock).sources
    meter = EnergyMeter(sources, clock=clock, rescan_seconds=5.0, retry_max_seconds=1.0)
    rig = Rig(powercap, clock, meter)
    rig.read()
    rig.run(200.0, 8.0)
    energy = powercap.energy(ENTRY)
    powercap.remove(ENTRY)  # unreadable, and missing from the re-listing at 10 s
    for _ in range(6):
        rig.clock.tick()
        rig.truth += 200.0
        energy += 200_000_000
        rig.read()
    assert [present for info, _, present, _, _ in meter.zone_states() if info.zone == "package-0"] == [False]
    # listed again at 15 s: still counting, or reset (1.2 kJ since)
    powercap.add(ENTRY, "package-0", energy_uj=energy if kept_counting else 1_200_000_000)
    rig.run(200.0, 5.0)
    measured = rig.read()
    assert {kind for (_, zone, kind) in meter.anomalies if zone == "package-0"} == kinds
    assert measured <= rig.truth + 1e-6
    if kept_counting:
        assert measured == pytest.approx(rig.truth, abs=1e-6)
    else:  # the interval over the absence is unknown: exported as discarded, nothing invented
        assert meter.discarded_seconds[("rapl_sysfs", "package-0", "reset")] == pytest.approx(7.0)  # 8 s → 15 s
        assert measured == pytest.approx(rig.truth - 7 * 200.0, abs=1e-6)


def test_a_power_zone_missing_from_a_relisting_longer_than_a_gap_is_a_gap(clock: FakeClock) -> None:
    zone = FakeZone("chassis", "platform", "power", clock, 300.0)
    bmc = FakeSource("ipmi_dcmi", [zone])
    meter = EnergyMeter([bmc], clock=clock, rescan_seconds=5.0, max_gap_seconds=2.5)
    meter.read()
    for t in range(1, 21):
        clock.tick()
        bmc.zone_list = [] if 8 <= t < 14 else [zone]  # missing at the re-listing at 10 s, back at 15 s
        meter.read()
    assert meter.anomalies == {("ipmi_dcmi", "chassis", "gap"): 1}
    assert meter.discarded_seconds[("ipmi_dcmi", "chassis", "gap")] == pytest.approx(6.0)  # 9 s → 15 s
    assert meter.read().totals[("ipmi_dcmi", "chassis")] / 1e9 == pytest.approx(300.0 * (20 - 6))


def test_a_zone_back_from_a_relisting_lower_than_it_went_is_a_reset_even_where_a_wrap_would_be_plausible(
    roots: Roots, powercap: PowercapTree, clock: FakeClock
) -> None:
    """Gone 1,000 s and back at 50 J from 200 kJ: a wrap would mean 62 W, plausible, but a zone
    re-enumerated starts again from 0; nothing is invented for the time it was gone."""
    powercap.add(ENTRY, "package-0", energy_uj=100_000_000_000)
    powercap.add("intel-rapl:1", "package-1")
    sources = open_sources(("rapl_sysfs",), {}, roots, clock).sources
    meter = EnergyMeter(sources, clock=clock, rescan_seconds=5.0, retry_max_seconds=1.0)
    rig = Rig(powercap, clock, meter)
    rig.read()
    rig.run(100.0, 8.0)
    before = rig.read()
    powercap.remove(ENTRY)
    for _ in range(1_000):
        rig.clock.tick()
        rig.read()
    powercap.add(ENTRY, "package-0", energy_uj=50_000_000)
    for _ in range(6):  # the re-listing at the next rescan lists it again
        rig.clock.tick()
        rig.read()
    assert {kind for (_, zone, kind) in meter.anomalies if zone == "package-0"} == {"reset"}
    assert rig.read() == pytest.approx(before, abs=1e-6)  # the 62 kJ a wrap would say: not counted
