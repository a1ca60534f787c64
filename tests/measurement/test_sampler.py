"""The sampler driven through time over replica trees with an injected clock."""

from __future__ import annotations

import errno
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from joulesched.contracts import names as n
from joulesched.measurement.config import AgentConfig, AttributionConfig, CrossCheckConfig, ModelConfig, SourcesConfig
from joulesched.measurement.exporters.profile import profile_document
from joulesched.measurement.exporters.prometheus import families
from joulesched.measurement.exporters.record import RecordingWriter, load_recording
from joulesched.measurement.sampler import Sampler, UnknownWindow
from joulesched.measurement.snapshot import Snapshot
from joulesched.measurement.sources.base import Reading, Roots, Source
from joulesched.measurement.sources.cgroup_cpu import CgroupCpu
from joulesched.measurement.sources.kube_pods import PodMeta
from joulesched.measurement.sources.procfs_stat import ProcStat
from joulesched.measurement.sources.registry import open_sources
from joulesched.policy.profile import parse_profiles
from tests.measurement.fakes import FakeClock, FakeSource, FakeZone, gpus, ipmi
from tests.measurement.replica import CgroupTree, PowercapTree, ProcTree

POD_A = "aaaaaaaa-0000-4000-8000-000000000001"
POD_B = "bbbbbbbb-0000-4000-8000-000000000002"
POD_C = "cccccccc-0000-4000-8000-000000000003"
ORDER = ("rapl_sysfs", "ipmi_dcmi", "nvml")


def config(**kwargs: object) -> AgentConfig:
    base: dict[str, object] = {
        "sources": SourcesConfig(order=ORDER, rescan_seconds=5.0),
        "model": ModelConfig(window_samples=100, min_samples=5, min_spread_cores=0.5),
    }
    base.update(kwargs)
    return AgentConfig(**base)  # type: ignore[arg-type]


def sampler(
    roots: Roots, clock: FakeClock, *extra: Source, cfg: AgentConfig | None = None, rapl: bool = True
) -> Sampler:
    sources: list[Source] = list(open_sources(("rapl_sysfs",), {}, roots, clock).sources) if rapl else []
    sources += extra
    return Sampler(
        replace(cfg or config(), roots=roots),
        sources,
        node="n1",
        clock=clock,
        cgroups=CgroupCpu(roots.cgroup),
        procstat=ProcStat(roots.procfs),
    )


def zone_total(snap: Snapshot, zone: str) -> float:
    return next(z.joules_total for z in snap.zones if z.zone == zone)


def assert_interval_conserved(snap: Snapshot) -> None:
    iv = snap.interval
    assert iv is not None
    assert sum(iv.domains.values()) == pytest.approx(iv.node_joules, rel=1e-12, abs=1e-9)
    for domain, joules in iv.domains.items():
        parts = sum(p.get(domain, 0.0) for p in iv.pods.values()) + sum(b.get(domain, 0.0) for b in iv.buckets.values())
        assert parts == pytest.approx(joules, rel=1e-12, abs=1e-9), domain


class Node:
    """A replica node: two sockets of RAPL, a cgroup v2 tree, /proc, moved one interval at a time."""

    def __init__(self, powercap: PowercapTree, cgroup: CgroupTree, proc: ProcTree, clock: FakeClock) -> None:
        self.powercap, self.cgroup, self.proc, self.clock = powercap.server(sockets=2), cgroup, proc, clock
        self.busy = 0.0
        self.idle = 0.0
        self.cpu: dict[str, float] = {}

    def add_pod(self, uid: str, qos: str = "burstable", millicores: float = 500) -> None:
        self.cpu[uid] = 0.0
        self.cgroup.add_pod(uid, qos, 0.0, millicores)

    def remove_pod(self, uid: str) -> None:
        self.cpu.pop(uid)
        self.cgroup.remove_pod(uid)

    def step(
        self,
        seconds: float = 1.0,
        package_w: float = 100.0,
        dram_w: float = 10.0,
        pods: dict[str, float] | None = None,
        system: float = 0.5,
    ) -> None:
        self.clock.tick(seconds)
        for s in (0, 1):
            self.powercap.advance(f"intel-rapl:{s}", package_w * seconds)
            self.powercap.advance(f"intel-rapl:{s}:0", package_w * 0.7 * seconds)
            self.powercap.advance(f"intel-rapl:{s}:1", dram_w * seconds)
        busy = system * seconds
        for uid, cores in (pods or {}).items():
            self.cpu[uid] += cores * seconds
            self.cgroup.set_cpu(uid, self.cpu[uid])
            busy += cores * seconds
        self.busy += busy
        self.idle += 8 * seconds - busy
        self.proc.set_stat(self.busy, self.idle)


@pytest.fixture
def node(powercap: PowercapTree, cgroup: CgroupTree, proc: ProcTree, clock: FakeClock) -> Node:
    return Node(powercap, cgroup, proc, clock)


def test_first_sample_is_a_baseline(node: Node, roots: Roots, clock: FakeClock) -> None:
    s = sampler(roots, clock)
    snap = s.sample()
    assert snap.interval is None
    assert snap.basis == "rapl_sysfs"
    assert all(z.joules_total == 0 for z in snap.zones)


def test_wrap_between_reads_is_counted_exactly(node: Node, roots: Roots, clock: FakeClock) -> None:
    node.powercap.set("intel-rapl:0", 262_143_328_850 - 10_000_000)  # 10 J before the wrap
    s = sampler(roots, clock)
    s.sample()
    for _ in range(3):
        node.step(package_w=123.456789)
        snap = s.sample()
    assert zone_total(snap, "package-0") == pytest.approx(3 * 123.456789, abs=1e-6)
    assert node.powercap.energy("intel-rapl:0") < 400_000_000  # it did wrap
    assert snap.anomalies == ()


def test_spurious_jump_is_dropped_counted_and_logged_once(
    node: Node, roots: Roots, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    s = sampler(roots, clock)
    s.sample()
    node.step()
    s.sample()
    for _ in range(2):
        clock.tick()
        node.powercap.advance("intel-rapl:0", 50_000.0)  # 50 kJ in a second: no socket draws that
        snap = s.sample()
    assert ("rapl_sysfs", "package-0", "implausible", 2) in snap.anomalies
    assert zone_total(snap, "package-0") == pytest.approx(100.0)  # only the plausible second
    logged = [r for r in caplog.records if "implausible energy delta dropped" in r.getMessage()]
    assert len(logged) == 1


def test_hot_plugged_zone_joins_at_the_next_rescan(node: Node, roots: Roots, clock: FakeClock) -> None:
    s = sampler(roots, clock)
    s.sample()
    node.powercap.add("intel-rapl:2", "package-2", energy_uj=7_000_000)
    node.step(seconds=2.0)
    assert "package-2" not in {z.zone for z in s.sample().zones}
    for _ in range(3):  # rescan every 5 s: the zone is listed at t=6 and counts from there
        node.step(seconds=2.0)
        node.powercap.advance("intel-rapl:2", 2 * 40.0)
        snap = s.sample()
    assert zone_total(snap, "package-2") == pytest.approx(80.0)
    node.powercap.remove("intel-rapl:2")
    for _ in range(3):
        node.step(seconds=2.0)
        snap = s.sample()
    zone = next(z for z in snap.zones if z.zone == "package-2")
    assert not zone.present and zone.joules_total == pytest.approx(80.0)


def test_pods_and_buckets_add_up_every_interval_as_pods_come_and_go(node: Node, roots: Roots, clock: FakeClock) -> None:
    cfg = config(
        attribution=AttributionConfig(idle_policy="requests", pod_retention_seconds=3600, cgroup_rescan_seconds=1.0)
    )
    s = sampler(roots, clock, cfg=cfg)
    node.add_pod(POD_A, "guaranteed", 2000)
    node.add_pod(POD_B, "burstable", 500)
    s.sample()
    plan = [
        {POD_A: 2.0, POD_B: 0.5},
        {POD_A: 1.0, POD_B: 3.0},
        {POD_A: 4.0},
        {POD_A: 0.0, POD_C: 1.0},
        {POD_C: 2.0},
        {POD_C: 6.0},
    ]
    node_total = 0.0
    for step, load in enumerate(plan):
        if step == 2:
            node.remove_pod(POD_B)  # vanished between samples: its last part goes to the system bucket
        if step == 3:
            node.add_pod(POD_C, "besteffort", 0)
        if step == 4:
            node.remove_pod(POD_A)
        node.step(package_w=60 + 20 * sum(load.values()), pods={k: v for k, v in load.items() if k in node.cpu})
        snap = s.sample()
        assert_interval_conserved(snap)
        node_total += snap.interval.node_joules  # type: ignore[union-attr]
    pods = sum(sum(p.energy_joules_total.values()) for p in snap.pods)
    buckets = sum(sum(d.values()) for d in snap.buckets_total.values())
    assert pods + buckets == pytest.approx(node_total, rel=1e-12)
    assert snap.node_energy_total["rapl_sysfs"] == pytest.approx(node_total)
    assert {p.uid: p.present for p in snap.pods} == {POD_A: False, POD_B: False, POD_C: True}


def test_vanished_pods_are_dropped_after_retention(node: Node, roots: Roots, clock: FakeClock) -> None:
    cfg = config(attribution=AttributionConfig(pod_retention_seconds=2.0, cgroup_rescan_seconds=1.0))
    s = sampler(roots, clock, cfg=cfg)
    node.add_pod(POD_A)
    s.sample()
    node.step(pods={POD_A: 1.0})
    s.sample()
    node.remove_pod(POD_A)
    node.step()
    assert [p.present for p in s.sample().pods] == [False]
    for _ in range(3):
        node.step()
        snap = s.sample()
    assert snap.pods == ()


def test_power_source_is_integrated_with_its_own_timestamps_and_is_the_basis(
    node: Node, roots: Roots, clock: FakeClock
) -> None:
    server = ipmi(clock, watts=300.0)
    s = sampler(roots, clock, server)
    s.sample()
    for watts in (300.0, 340.0, 380.0):
        server.zone("chassis").value = watts
        node.step()
        snap = s.sample()
        assert_interval_conserved(snap)
    assert snap.basis == "ipmi_dcmi"
    assert zone_total(snap, "chassis") == pytest.approx(320.0 + 360.0 + 300.0)
    iv = snap.interval
    assert iv is not None
    assert iv.domains["cpu"] == pytest.approx(200.0)  # RAPL still splits cpu and dram
    assert iv.domains["dram"] == pytest.approx(20.0)
    assert iv.domains["other"] == pytest.approx(360.0 - 220.0)
    assert snap.ratios["rapl_sysfs/ipmi_dcmi"] == pytest.approx(660.0 / 980.0)


def test_cross_check_warns_once_when_sources_drift(
    node: Node, roots: Roots, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    second = FakeSource("redfish", [])
    server, other = ipmi(clock, 400.0), ipmi(clock, 400.0)
    second.zone_list = other.zone_list
    cfg = config(
        sources=SourcesConfig(order=("rapl_sysfs", "ipmi_dcmi", "redfish")),
        cross_check=CrossCheckConfig(drift=0.05, window_seconds=3.0),
    )
    s = sampler(roots, clock, server, second, cfg=cfg)
    s.sample()
    for watts in (400.0, 400.0, 400.0, 460.0, 460.0, 460.0, 460.0):
        other.zone_list[0].value = watts
        node.step()
        snap = s.sample()
    assert snap.ratios["redfish/ipmi_dcmi"] == pytest.approx(1.15)
    warnings = [r.getMessage() for r in caplog.records if "disagree" in r.getMessage()]
    assert sum("redfish/ipmi_dcmi" in w for w in warnings) == 1  # once, though it stays off
    assert sum("rapl_sysfs/redfish" in w for w in warnings) == 1  # RAPL moved away from redfish too
    assert not any("rapl_sysfs/ipmi_dcmi" in w for w in warnings)  # but not from the steady IPMI


def test_a_failing_source_does_not_stop_the_others(
    node: Node, roots: Roots, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ipmi(clock, 250.0)
    s = sampler(roots, clock, server)
    s.sample()
    node.step()
    s.sample()
    target = os.path.realpath(node.powercap.base / "intel-rapl:1" / "energy_uj")
    real_open = os.open

    def denied(path: str, flags: int, *args: int) -> int:
        if os.path.realpath(path) == target and flags & os.O_ACCMODE == os.O_RDONLY:  # the replica still writes
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", denied)
    node.step()
    snap = s.sample()
    health = {h.name: h for h in snap.sources}
    assert not health["rapl_sysfs"].up
    assert "permission denied — run the agent as root" in health["rapl_sysfs"].error
    assert health["ipmi_dcmi"].up
    assert zone_total(snap, "chassis") == pytest.approx(500.0)
    assert zone_total(snap, "package-0") == pytest.approx(200.0)  # the readable zone kept going
    monkeypatch.setattr(os, "open", real_open)
    node.step()
    snap = s.sample()
    assert zone_total(snap, "package-1") == pytest.approx(300.0)  # caught up: nothing lost
    assert {h.name: h.up for h in snap.sources} == {"rapl_sysfs": True, "ipmi_dcmi": True}


def test_gpu_energy_goes_to_the_pod_whose_process_uses_it(
    node: Node, roots: Roots, clock: FakeClock, cgroup: CgroupTree, proc: ProcTree
) -> None:
    node.add_pod(POD_A, "guaranteed", 4000)
    node.add_pod(POD_B)
    cards = gpus(clock, count=2)
    cards.limits = {"gpu-0": 700.0, "gpu-1": 700.0}
    proc.add_process(4242, f"0::{cgroup.cgroup_path(POD_A, '0' * 64)}\n")
    proc.add_process(999, "0::/system.slice/nvidia-persistenced.service\n")
    cards.processes = {4242: {"gpu-0": 0.75}, 999: {"gpu-0": 0.25}}
    cfg = config(attribution=AttributionConfig(idle_policy="bucket"))
    s = sampler(roots, clock, cards, cfg=cfg)
    s.sample()
    for _ in range(3):
        cards.zone("gpu-0").value += 400.0
        cards.zone("gpu-1").value += 60.0
        node.step(pods={POD_A: 1.0, POD_B: 1.0})
        snap = s.sample()
        assert_interval_conserved(snap)
    iv = snap.interval
    assert iv is not None
    assert snap.basis == "rapl_sysfs+nvml"
    assert iv.domains["gpu"] == pytest.approx(460.0)
    # no GPU model yet: idle is the lowest power seen (400 W on gpu-0, 60 W on gpu-1), so all of
    # it is idle here and goes to the idle bucket under the bucket policy
    assert iv.pods[POD_A]["gpu"] == pytest.approx(0.0)
    assert iv.buckets["idle"]["gpu"] == pytest.approx(460.0)
    cards.zone("gpu-0").value += 500.0  # 100 W above idle: dynamic, split 3:1 with the daemon
    cards.zone("gpu-1").value += 60.0
    node.step(pods={POD_A: 1.0, POD_B: 1.0})
    snap = s.sample()
    assert snap.interval is not None
    assert snap.interval.pods[POD_A]["gpu"] == pytest.approx(75.0)
    assert snap.interval.pods[POD_B]["gpu"] == pytest.approx(0.0)
    assert snap.interval.buckets["system"]["gpu"] == pytest.approx(25.0)
    assert snap.gpus is not None and snap.gpus.count == 2 and snap.gpus.max_watts == 700.0


def test_power_model_fit_feeds_a_valid_profile(node: Node, roots: Roots, clock: FakeClock) -> None:
    node.add_pod(POD_A)
    s = sampler(roots, clock)
    assert profile_document(s.sample()) is None  # no fit yet
    for cores in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
        # 2 sockets × (40 + 10·busy/2) W + 2 × 10 W of DRAM: idle 100 W, 10 W per busy core
        node.step(package_w=40 + 5 * (cores + 0.5), dram_w=10.0, pods={POD_A: cores})
        snap = s.sample()
    fit = snap.model("cpu")
    assert fit is not None
    assert fit.idle_watts == pytest.approx(100.0, abs=1e-6)
    assert fit.slope_watts == pytest.approx(10.0, abs=1e-6)
    assert fit.r2 == pytest.approx(1.0)
    doc = profile_document(snap)
    assert doc is not None
    profiles = parse_profiles(doc, "GET /v1/profile")
    profile = profiles.nodes[0]
    assert profile.name == "n1" and profile.cores == 8
    assert profile.power_curve_watts[0] == pytest.approx(100.0)
    assert profile.power_curve_watts[-1] == pytest.approx(180.0)
    assert profile.sources == ("rapl_sysfs",)
    assert profile.updated == clock.now


def test_window_energy_is_the_difference_of_counter_reads_at_its_edges(
    node: Node, roots: Roots, clock: FakeClock
) -> None:
    node.powercap.set("intel-rapl:0", 262_143_328_850 - 1_000_000)
    s = sampler(roots, clock)
    s.sample()
    node.powercap.advance("intel-rapl:0", 0.4)  # before the window: not counted
    window = s.open_window("run-1")
    node.powercap.advance("intel-rapl:0", 0.35)  # between samples, across the wrap
    node.powercap.advance("intel-rapl:0:1", 0.05)
    clock.tick(0.3)
    s.sample()
    node.powercap.advance("intel-rapl:0", 0.25)
    clock.tick(0.2)
    result = s.close_window(window.id)
    node.powercap.advance("intel-rapl:0", 9.0)  # after the window: not counted
    assert result["label"] == "run-1"
    assert result["seconds"] == pytest.approx(0.5)
    assert result["joules"]["cpu"] == pytest.approx(0.6, abs=1e-9)
    assert result["joules"]["dram"] == pytest.approx(0.05, abs=1e-9)
    assert result["joules"]["node"] == pytest.approx(0.65, abs=1e-9)
    assert result["basis"] == "rapl_sysfs"
    with pytest.raises(UnknownWindow):
        s.close_window(window.id)


def test_a_sampler_without_any_source_still_reports_cpu(
    roots: Roots, clock: FakeClock, cgroup: CgroupTree, proc: ProcTree
) -> None:
    s = Sampler(config(), [], node="n1", clock=clock, cgroups=CgroupCpu(roots.cgroup), procstat=ProcStat(roots.procfs))
    s.sample()
    clock.tick()
    proc.set_stat(2.0, 6.0)
    snap = s.sample()
    assert snap.basis == "" and snap.node_power_watts is None
    assert snap.utilisation == pytest.approx(0.25)
    assert snap.busy_cpu_seconds_total == pytest.approx(2.0)


def test_clock_going_back_skips_the_interval(
    node: Node, roots: Roots, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    s = sampler(roots, clock)
    s.sample()
    clock.tick(-5.0)
    with caplog.at_level(logging.WARNING):
        snap = s.sample()
    assert snap.interval is None
    assert any("clock did not advance" in r.getMessage() for r in caplog.records)


def test_a_besteffort_pods_kubelet_floor_of_shares_is_no_request(node: Node, roots: Roots, clock: FakeClock) -> None:
    """The kubelet writes 2 shares (weight 1) for a pod that requests no CPU: under requests,
    the idle energy then stays in the idle bucket, as docs/agent.md says."""
    from joulesched.measurement.config import AttributionConfig

    s = sampler(roots, clock, cfg=config(attribution=AttributionConfig(idle_policy="requests", cgroup_rescan_seconds=1.0)))
    node.add_pod(POD_C, "besteffort", 0)
    s.sample()
    for _ in range(4):
        node.step(pods={POD_C: 0.5})
        snap = s.sample()
    assert snap.interval is not None and sum(snap.interval.buckets["idle"].values()) > 0
    assert [p.requests_millicores for p in snap.pods] == [0.0]


def test_a_window_over_a_source_that_opened_within_it_counts_the_sources_read_at_both_edges(
    roots: Roots, powercap: PowercapTree, clock: FakeClock
) -> None:
    from joulesched.measurement.config import AgentConfig, SourcesConfig
    from joulesched.measurement.errors import SourceFailed
    from joulesched.measurement.meter import Pending
    from joulesched.measurement.sources.registry import open_sources
    from tests.measurement.fakes import FakeSource, FakeZone

    powercap.add("intel-rapl:0", "package-0", energy_uj=5_000_000_000)
    bmc_up = False

    def opener() -> FakeSource:
        if not bmc_up:
            raise SourceFailed("ipmi_dcmi: session timeout")
        return FakeSource("ipmi_dcmi", [FakeZone("chassis", "platform", "power", clock, 300.0)])

    cfg = AgentConfig(roots=roots, sources=SourcesConfig(order=("rapl_sysfs", "ipmi_dcmi")))
    s = Sampler(cfg, open_sources(("rapl_sysfs",), {}, roots, clock).sources, node="n1", clock=clock,
                pending=[Pending("ipmi_dcmi", opener, "ipmi_dcmi: session timeout")])
    s.sample()
    window = s.open_window("job")  # the BMC down: RAPL is the basis
    for i in range(10):
        clock.tick()
        powercap.advance("intel-rapl:0", 100.0)
        bmc_up = bmc_up or i == 2  # the BMC answers again; it becomes the node's basis
        s.sample()
    assert s.meter.layout.platform == "ipmi_dcmi"
    result = s.close_window(window.id)
    assert result["basis"] == "rapl_sysfs" and result["joules"]["node"] == pytest.approx(1000.0)


@pytest.mark.parametrize(
    ("pod_cores", "busy_each"),
    [(2.0, [3.0, 2.0, 4.0, 3.0]), (0.0, [1.0, 0.0, 2.0, 1.0])],
    ids=["a busy pod", "an idle pod: the fallback is 0"],
)
def test_a_failed_proc_stat_read_counts_no_busy_time_twice(
    node: Node, roots: Roots, clock: FakeClock, proc: ProcTree, pod_cores: float, busy_each: list[float]
) -> None:
    """The failed read's interval takes the pods' CPU time (the least the node was busy); the
    next good read's difference covers both intervals, so it counts only what that left out."""
    node.add_pod(POD_A)
    s = sampler(roots, clock)
    s.sample()
    busy = []
    for step in range(4):
        node.step(pods={POD_A: pod_cores}, system=1.0)  # the pod's cores and 1 of the system, of 8
        if step == 1:
            (proc.root / "stat").write_text("garbled\n")
        snap = s.sample()
        assert snap.interval is not None
        busy.append(snap.interval.busy_cpu_seconds)
    assert busy == pytest.approx(busy_each)
    assert snap.busy_cpu_seconds_total == pytest.approx(sum(busy_each))  # 4 s × the busy cores
    assert s.cpu_model.samples == 2  # neither the fallback nor its catch-up taught the power model


class Listing:
    """A pod directory: the API's list of this node's pods, as the test sets it."""

    def __init__(self, pods: dict[str, PodMeta]) -> None:
        self.pods = pods

    def lookup(self, uid: str) -> PodMeta | None:
        return self.pods.get(uid)

    def refresh(self) -> None:
        return None


def named_sampler(roots: Roots, clock: FakeClock, directory: Listing) -> Sampler:
    cfg = config(attribution=AttributionConfig(pod_retention_seconds=3600, cgroup_rescan_seconds=1.0))
    return Sampler(
        replace(cfg, roots=roots),
        open_sources(("rapl_sysfs",), {}, roots, clock).sources,
        node="n1",
        clock=clock,
        cgroups=CgroupCpu(roots.cgroup),
        procstat=ProcStat(roots.procfs),
        pods=directory,
    )


def pod_series(snap: Snapshot) -> list[tuple[str, str]]:
    """(namespace, pod) of every cpu-domain pod energy series in the exposition."""
    fam = next(f for f in families(snap) if f.name == n.POD_ENERGY.name.removesuffix("_total"))
    return sorted((s.labels["namespace"], s.labels["pod"]) for s in fam.samples if s.labels["domain"] == "cpu")


def test_a_deleted_pod_keeps_its_name_while_it_is_retained(
    node: Node, roots: Roots, clock: FakeClock, tmp_path: Path
) -> None:
    directory = Listing({POD_A: PodMeta(POD_A, "shop", "web-0", "StatefulSet", "web")})
    s = named_sampler(roots, clock, directory)
    node.add_pod(POD_A)
    recording = RecordingWriter(str(tmp_path / "rec.jsonl"))
    recording.write(s.sample())
    for step in range(4):
        if step == 2:
            node.remove_pod(POD_A)  # deleted: its cgroup goes ...
        if step == 3:
            del directory.pods[POD_A]  # ... and the next list of the API has it no more
        node.step(pods={POD_A: 1.5} if POD_A in node.cpu else {})
        snap = s.sample()
        recording.write(snap)
    recording.close()
    (pod,) = snap.pods
    assert (pod.namespace, pod.name, pod.owner, pod.present) == ("shop", "web-0", "web", False)
    assert pod_series(snap) == [("shop", "web-0")]
    assert load_recording(str(tmp_path / "rec.jsonl")).pods[POD_A]["name"] == "web-0"


def test_a_successor_that_takes_a_retained_pods_name_ends_its_retention(
    node: Node, roots: Roots, clock: FakeClock
) -> None:
    """The pod series have no uid label: one series per namespace and name, the successor's (a
    counter reset to its energy), never two with the same labels in one exposition."""
    directory = Listing({POD_A: PodMeta(POD_A, "shop", "web-0", "StatefulSet", "web")})
    s = named_sampler(roots, clock, directory)
    node.add_pod(POD_A)
    s.sample()
    node.step(pods={POD_A: 1.5})
    s.sample()
    node.remove_pod(POD_A)
    del directory.pods[POD_A]
    node.step()
    assert [(p.uid, p.name, p.present) for p in s.sample().pods] == [(POD_A, "web-0", False)]
    node.add_pod(POD_B)  # the StatefulSet's successor, on this node
    directory.pods[POD_B] = PodMeta(POD_B, "shop", "web-0", "StatefulSet", "web")
    for _ in range(2):
        node.step(pods={POD_B: 1.0})
        snap = s.sample()
        assert pod_series(snap) == [("shop", "web-0")]
    assert [(p.uid, p.name, p.present) for p in snap.pods] == [(POD_B, "web-0", True)]


def test_a_new_pods_gpu_use_in_its_first_interval_goes_to_system(
    node: Node, roots: Roots, clock: FakeClock, cgroup: CgroupTree, proc: ProcTree
) -> None:
    """A pod is not attributed in the interval it is first seen in (its CPU time baselines); its
    processes' use of a GPU is then system's, not given to the other pods on that GPU."""
    node.add_pod(POD_A)
    cards = gpus(clock, count=1)
    proc.add_process(100, f"0::{cgroup.cgroup_path(POD_A, '0' * 64)}\n")
    cards.processes = {100: {"gpu-0": 0.1}}
    cfg = config(attribution=AttributionConfig(idle_policy="bucket", cgroup_rescan_seconds=1.0))
    s = sampler(roots, clock, cards, cfg=cfg)
    s.sample()
    for _ in range(3):  # no GPU model yet: idle is the lowest power seen, 100 W
        cards.zone("gpu-0").value += 100.0
        node.step(pods={POD_A: 0.5})
        s.sample()
    node.add_pod(POD_B)
    proc.add_process(200, f"0::{cgroup.cgroup_path(POD_B, '0' * 64)}\n")
    cards.processes = {100: {"gpu-0": 0.1}, 200: {"gpu-0": 0.9}}
    for pod_b in (0.0, 40.0 * 9):  # B's first interval, then its second
        cards.zone("gpu-0").value += 500.0  # 400 J dynamic: A's processes used 0.1 of the 1.0 in use
        node.step(pods={POD_A: 0.5, POD_B: 0.5})
        snap = s.sample()
        assert_interval_conserved(snap)
        iv = snap.interval
        assert iv is not None
        assert iv.pods[POD_A]["gpu"] == pytest.approx(40.0)
        assert iv.pods.get(POD_B, {}).get("gpu", 0.0) == pytest.approx(pod_b)
        assert iv.buckets["system"]["gpu"] == pytest.approx(360.0 - pod_b)


@dataclass
class LaggingBmc:
    """A whole-server power zone whose BMC refreshes its reading every ``refresh`` seconds,
    stamped with when it took it."""

    clock: FakeClock
    watts: float
    refresh: float = 2.0
    name: str = "chassis"
    domain: str = "platform"
    kind: str = "power"
    max_joules: float | None = None
    parent: str | None = None

    def read(self) -> Reading:
        return Reading(self.watts, math.floor(self.clock() / self.refresh) * self.refresh)


def rapl_measured(snap: Snapshot) -> dict[str, float]:
    """cpu and dram as RAPL measured them: every package and DRAM zone's total."""
    totals = {"cpu": 0.0, "dram": 0.0}
    for z in snap.zones:
        if z.parent is None and z.domain in ("package", "dram"):
            totals["cpu" if z.domain == "package" else "dram"] += z.joules_total
    return totals


@pytest.mark.parametrize(
    "bmc",
    [
        lambda clock: FakeSource("ipmi_dcmi", [LaggingBmc(clock, 400.0)]),  # type: ignore[list-item]
        lambda clock: ipmi(clock, 400.0),  # read every interval, but one read fails (below)
    ],
    ids=["a BMC refreshing every 2 s, sampled every second", "one failed BMC read caught up by the next"],
)
def test_rapl_keeps_its_cpu_and_dram_under_a_server_reading_that_lags(
    node: Node, roots: Roots, clock: FakeClock, bmc: Callable[[FakeClock], FakeSource]
) -> None:
    """An interval without a new server reading has no server energy: RAPL's parts are carried
    to the next, whose reading covers both, rather than scaled to nothing and moved to other."""
    server = bmc(clock)
    s = sampler(roots, clock, server)
    s.sample()
    node_total = 0.0
    for step in range(10):
        if isinstance(server.zone_list[0], FakeZone):
            server.zone("chassis").fail = "ipmi_dcmi: timeout" if step == 4 else ""
        node.step()  # 2 × (100 W package + 10 W DRAM) under a 400 W server
        snap = s.sample()
        assert_interval_conserved(snap)
        node_total += snap.interval.node_joules  # type: ignore[union-attr]
    assert snap.basis == "ipmi_dcmi"
    rapl = rapl_measured(snap)
    assert rapl == pytest.approx({"cpu": 2000.0, "dram": 200.0})
    assert snap.domain_energy_total["cpu"] == pytest.approx(rapl["cpu"])
    assert snap.domain_energy_total["dram"] == pytest.approx(rapl["dram"])
    assert sum(snap.domain_energy_total.values()) == pytest.approx(node_total)
    assert snap.domain_energy_total["other"] == pytest.approx(4000.0 - 2200.0)


def test_a_server_reading_below_rapls_is_believed_and_owes_nothing_later(
    node: Node, roots: Roots, clock: FakeClock
) -> None:
    """A server reading that is up to date is not lagging: parts above it are scaled to fit,
    and nothing of them is carried to the intervals after it reads sensibly again."""
    server = ipmi(clock, 150.0)  # below RAPL's 220 W: a BMC reading one of two supplies
    s = sampler(roots, clock, server)
    s.sample()
    for _ in range(5):
        node.step()
        snap = s.sample()
        assert snap.interval is not None
        assert snap.interval.domains["other"] == pytest.approx(0.0, abs=1e-9)
    server.zone("chassis").value = 400.0
    for other in (275.0 - 220.0, 400.0 - 220.0):  # the trapezoid from 150 to 400 W, then 400 W
        node.step()
        snap = s.sample()
        assert snap.interval is not None
        assert snap.interval.domains == pytest.approx({"cpu": 200.0, "dram": 20.0, "gpu": 0.0, "other": other})


def test_the_power_model_learns_a_lagging_server_reading_over_the_span_it_covers(
    node: Node, roots: Roots, clock: FakeClock
) -> None:
    """A BMC refreshing every 2 s, sampled every second: an interval without a new reading has
    no server energy (0 W) and the one with it the energy since the last (twice the power). The
    node's model learns the power over the span the server energy covers, against the CPU use
    over that span, never a 0 W or a doubled interval."""
    node.add_pod(POD_A)
    bmc = LaggingBmc(clock, 100.0)
    s = sampler(roots, clock, FakeSource("ipmi_dcmi", [bmc]))  # type: ignore[list-item]
    s.sample()
    for cores in (0.0, 0.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 3.0, 3.0, 1.0, 1.0, 5.0, 5.0) * 2:
        # 100 W idle, 10 W a busy core (the pod's and the system's half core), held for the
        # BMC's whole 2 s period
        bmc.watts = 100.0 + 10.0 * (cores + 0.5)
        node.step(package_w=20.0, dram_w=5.0, pods={POD_A: cores})
        snap = s.sample()
    assert snap.basis == "ipmi_dcmi"
    fit = snap.model("cpu")
    assert fit is not None
    assert fit.idle_watts == pytest.approx(100.0, abs=2.0)
    assert fit.slope_watts == pytest.approx(10.0, abs=0.5)
    assert fit.r2 > 0.95
