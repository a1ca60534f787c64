"""What the agent exports when nothing happened yet or nothing was measured.

* The anomaly counters exist at 0 from a zone's first snapshot: a counter that first appears
  at 1 hides its first event from ``increase()``.
* A utilisation with no measurement behind it (before the first interval, a clock that did not
  advance, a failed GPU query) is left out, never exported as 0 (an idle node).
* The read-duration histogram has buckets up to the slowest sources' timeouts.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Iterator
from dataclasses import replace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from joulesched.contracts import names as n
from joulesched.measurement import meter as meter_module
from joulesched.measurement import sampler as sampler_module
from joulesched.measurement.errors import SourceFailed
from joulesched.measurement.exporters.prometheus import make_registry
from joulesched.measurement.meter import EnergyMeter
from joulesched.measurement.sampler import GPU_UTIL_WARN_SECONDS
from joulesched.measurement.snapshot import ANOMALY_KINDS, READ_SECONDS_BUCKETS, UNESTIMATED_KINDS, Snapshot
from joulesched.measurement.sources.base import Reading, Roots
from joulesched.policy.energy import counter_delta, trapezoid
from tests.measurement.fakes import FakeClock, FakeSource, FakeZone, gpus, ipmi
from tests.measurement.replica import CgroupTree, PowercapTree, ProcTree
from tests.measurement.test_exposition import golden_snapshot
from tests.measurement.test_sampler import POD_A, Node, sampler

ANOMALY_COUNTERS = (n.ANOMALIES, n.DISCARDED_SECONDS, n.ESTIMATED_SECONDS)


@pytest.fixture
def node(powercap: PowercapTree, cgroup: CgroupTree, proc: ProcTree, clock: FakeClock) -> Node:
    return Node(powercap, cgroup, proc, clock)


def samples(snap: Snapshot) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(make_registry(lambda: snap)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(got: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float | None:
    return got.get((name, tuple(sorted(labels.items()))))


# -- anomaly counters ---------------------------------------------------------------------------


def test_anomaly_counters_exist_at_zero_from_a_zones_first_snapshot(node: Node, roots: Roots, clock: FakeClock) -> None:
    s = sampler(roots, clock, ipmi(clock, 300.0))
    got = samples(s.sample())  # the first snapshot: nothing has happened yet
    for zone, kind in (("package-0", "counter"), ("dram-1", "counter")):
        for k in ANOMALY_KINDS[kind]:
            for metric in ANOMALY_COUNTERS:
                want = None if metric is n.ESTIMATED_SECONDS and k in UNESTIMATED_KINDS else 0.0
                assert value(got, metric.name, source="rapl_sysfs", zone=zone, kind=k) == want, (metric.name, zone, k)
    assert value(got, n.ANOMALIES.name, source="ipmi_dcmi", zone="chassis", kind="gap") == 0.0
    assert value(got, n.ANOMALIES.name, source="ipmi_dcmi", zone="chassis", kind="reset") is None  # a power zone
    node.step()
    s.sample()
    clock.tick()
    node.powercap.advance("intel-rapl:0", 50_000.0)  # 50 kJ in a second: implausible
    got = samples(s.sample())
    # the same series goes 0 -> 1: increase() sees the first anomaly
    assert value(got, n.ANOMALIES.name, source="rapl_sysfs", zone="package-0", kind="implausible") == 1.0
    assert value(got, n.ANOMALIES.name, source="rapl_sysfs", zone="package-0", kind="gap") == 0.0


def test_a_zone_listed_later_gets_its_anomaly_counters_when_it_appears(node: Node, roots: Roots, clock: FakeClock) -> None:
    s = sampler(roots, clock)
    s.sample()
    node.powercap.add("intel-rapl:2", "package-2", energy_uj=7_000_000)
    got = samples(s.sample())
    assert value(got, n.ANOMALIES.name, source="rapl_sysfs", zone="package-2", kind="reset") is None  # not listed yet
    node.step(seconds=6.0)  # past sources.rescan_seconds (5 s)
    got = samples(s.sample())
    assert value(got, n.ANOMALIES.name, source="rapl_sysfs", zone="package-2", kind="reset") == 0.0


def _counter_kinds() -> Iterator[str | None]:
    for max_joules in (100.0, None):
        for prev, cur, dt in ((10, 20, 1), (10, 5, 1), (10, 5, 100), (10, 200, 1), (10, 20, 0), (10, -1, 1), (10, 5, 1e-6)):
            yield counter_delta(prev, cur, max_joules, dt, 50.0, wrap_watts=20.0).anomaly
            yield counter_delta(prev, cur, max_joules, dt, 50.0).anomaly


def _power_kinds() -> Iterator[str | None]:
    for prev_t, cur_t, watts in ((0, 1, 10), (1, 0, 10), (0, 100, 10), (0, 1, -5), (0, 1, 1e9), (0, 0, 10)):
        yield trapezoid(10.0, prev_t, watts, cur_t, 1000.0, 30.0).anomaly


def test_the_kinds_pre_created_are_the_kinds_a_zone_can_count() -> None:
    assert set(_counter_kinds()) - {None} == set(ANOMALY_KINDS["counter"])
    assert set(_power_kinds()) - {None} == set(ANOMALY_KINDS["power"])


def test_a_kind_not_pre_created_is_still_exported() -> None:
    snap = replace(golden_snapshot(), anomalies=(("ipmi_dcmi", "chassis", "reset", 3),))
    got = samples(snap)
    assert value(got, n.ANOMALIES.name, source="ipmi_dcmi", zone="chassis", kind="reset") == 3.0
    assert value(got, n.ANOMALIES.name, source="ipmi_dcmi", zone="chassis", kind="gap") == 0.0


# -- utilisation: absent, never 0, without a measurement ----------------------------------------


def cpu_util(snap: Snapshot) -> float | None:
    return value(samples(snap), n.NODE_CPU_UTILISATION.name, node="n1")


def gpu_util(snap: Snapshot) -> float | None:
    return value(samples(snap), n.NODE_GPU_UTILISATION.name, node="n1")


def test_cpu_utilisation_is_absent_before_the_first_interval(node: Node, roots: Roots, clock: FakeClock) -> None:
    s = sampler(roots, clock)
    first = s.sample()
    assert not first.utilisation_measured
    assert cpu_util(first) is None  # was 0.0: an idle node
    assert value(samples(first), n.NODE_CPU_CORES.name, node="n1") == 8.0  # the rest of the profile is there
    node.step(pods={}, system=2.0)
    assert cpu_util(s.sample()) == pytest.approx(2.0 / 8)


def test_cpu_utilisation_is_absent_for_an_interval_the_clock_did_not_advance_over(
    node: Node, roots: Roots, clock: FakeClock
) -> None:
    s = sampler(roots, clock)
    s.sample()
    node.step(system=4.0)
    assert cpu_util(s.sample()) == pytest.approx(0.5)
    assert cpu_util(s.sample()) is None  # dt = 0: nothing measured, the gauge is left out
    node.step(system=4.0)
    assert cpu_util(s.sample()) == pytest.approx(0.5)


def test_a_failing_gpu_utilisation_query_leaves_the_gauge_out_and_warns_once(
    node: Node, roots: Roots, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    node.add_pod(POD_A)
    cards = gpus(clock, count=1)
    node.proc.add_process(4242, f"0::{node.cgroup.cgroup_path(POD_A, '0' * 64)}\n")
    cards.processes = {4242: {"gpu-0": 0.9}}
    s = sampler(roots, clock, cards)
    s.sample()

    def step() -> Snapshot:
        cards.zone("gpu-0").value += 400.0
        node.step(pods={POD_A: 1.0})
        return s.sample()

    for _ in range(3):
        snap = step()
    assert gpu_util(snap) == pytest.approx(0.9)
    working = cards.process_utilisation

    def broken() -> dict[int, dict[str, float]]:
        raise SourceFailed("nvml gpu-0: nvmlDeviceGetProcessUtilization failed: GPU is lost")

    cards.process_utilisation = broken  # type: ignore[method-assign]
    caplog.set_level(logging.DEBUG, logger=sampler_module.__name__)
    for _ in range(5):
        snap = step()
        assert snap.gpus is not None and not snap.gpus.utilisation_measured
        assert gpu_util(snap) is None  # was 0.0: idle GPUs
        assert value(samples(snap), n.NODE_GPU_COUNT.name, node="n1") == 1.0  # the GPUs are still there

    def warnings() -> list[logging.LogRecord]:
        return [
            r for r in caplog.records
            if r.levelno == logging.WARNING and "GPU is lost" in r.getMessage() and r.name == sampler_module.__name__
        ]

    assert len(warnings()) == 1, [r.getMessage() for r in caplog.records]
    clock.tick(GPU_UTIL_WARN_SECONDS)
    step()
    assert len(warnings()) == 2 and "failures since the last warning" in warnings()[-1].getMessage()
    cards.process_utilisation = working  # type: ignore[method-assign]
    assert gpu_util(step()) == pytest.approx(0.9)
    assert any("available again" in r.getMessage() for r in caplog.records)


def test_a_gpu_whose_utilisation_is_unknown_teaches_its_model_nothing(
    node: Node, roots: Roots, clock: FakeClock
) -> None:
    cards = gpus(clock, count=1)
    s = sampler(roots, clock, cards)

    def broken() -> dict[int, dict[str, float]]:
        raise SourceFailed("nvml gpu-0: GPU is lost")

    cards.process_utilisation = broken  # type: ignore[method-assign]
    s.sample()
    for _ in range(10):  # 400 W at an unknown utilisation: not 400 W at 0 % (an idle power)
        cards.zone("gpu-0").value += 400.0
        node.step()
        s.sample()
    assert s._gpu_model("gpu-0").samples == 0


# -- read-duration buckets ----------------------------------------------------------------------


def test_a_read_that_runs_into_a_bmc_timeout_falls_in_a_bucket_of_its_own(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    assert {10.0, 15.0, 30.0} <= set(READ_SECONDS_BUCKETS)
    stopwatch = [0.0]
    monkeypatch.setattr(
        meter_module, "time", types.SimpleNamespace(perf_counter=lambda: stopwatch[0], monotonic=lambda: stopwatch[0])
    )
    zone = FakeZone("chassis", "platform", "power", clock, 300.0)
    slow = FakeSource("ipmi_dcmi", [zone])

    def read() -> Reading:
        stopwatch[0] += 12.0  # ipmitool waited 12 s of its 15 s timeout
        return Reading(300.0, clock())

    zone.read = read  # type: ignore[method-assign]
    meter = EnergyMeter([slow], clock=clock)
    meter.read()
    (src,) = meter.source_snapshots()
    snap = replace(golden_snapshot(), sources=(src,))
    got = samples(snap)
    bucket = "joulesched_source_read_duration_seconds_bucket"
    assert value(got, bucket, source="ipmi_dcmi", le="10") == 0.0
    assert value(got, bucket, source="ipmi_dcmi", le="15") == 1.0
    assert value(got, bucket, source="ipmi_dcmi", le="+Inf") == 1.0
