"""Per-pod CPU time from cgroup v1 and v2 with both drivers; node CPU time and pid → pod from procfs."""

from __future__ import annotations

from pathlib import Path

import pytest

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources.cgroup_cpu import CgroupCpu, shares_to_millicores, weight_to_shares
from joulesched.measurement.sources.procfs_stat import (
    ProcStat,
    parse_proc_stat,
    pod_uid_from_cgroup_text,
    pod_uid_of_pid,
)
from tests.measurement.replica import CgroupTree, ProcTree

UID_G = "0f6b1d7e-3c2a-4b59-9e4e-0a8d7c6b5a41"
UID_B = "5d2e8c1f-7a6b-4c3d-8e9f-1a2b3c4d5e6f"
UID_E = "9a8b7c6d-5e4f-4a3b-2c1d-0e9f8a7b6c5d"

LAYOUTS = [(2, "systemd"), (2, "cgroupfs"), (1, "systemd"), (1, "cgroupfs")]
LAYOUT_IDS = ["v2 systemd", "v2 cgroupfs", "v1 systemd", "v1 cgroupfs"]


@pytest.fixture(params=LAYOUTS, ids=LAYOUT_IDS)
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> CgroupTree:
    version, driver = request.param
    t = CgroupTree(tmp_path / "cgroup", version=version, driver=driver)
    t.add_pod(UID_G, "guaranteed", cpu_seconds=12.5, requests_millicores=2000, containers=2)
    t.add_pod(UID_B, "burstable", cpu_seconds=3.25, requests_millicores=500)
    t.add_pod(UID_E, "besteffort", cpu_seconds=0.5)
    return t


def test_every_qos_class_is_found_with_its_cpu_time(tree: CgroupTree) -> None:
    reader = CgroupCpu(str(tree.root))
    assert reader.version == tree.version
    assert reader.driver == tree.driver
    pods = {p.uid: p for p in reader.scan()}
    assert {uid: p.qos for uid, p in pods.items()} == {UID_G: "guaranteed", UID_B: "burstable", UID_E: "besteffort"}
    usage = reader.read(list(pods.values()))
    assert usage == pytest.approx({UID_G: 12.5, UID_B: 3.25, UID_E: 0.5})


def test_requests_come_back_from_shares_or_weight(tree: CgroupTree) -> None:
    pods = {p.uid: p for p in CgroupCpu(str(tree.root)).scan()}
    tolerance = 5.0 if tree.version == 1 else 60.0  # v2 weight is coarse: ~26 millicores per step
    assert pods[UID_G].requests_millicores == pytest.approx(2000, abs=tolerance)
    assert pods[UID_B].requests_millicores == pytest.approx(500, abs=tolerance)
    assert pods[UID_E].requests_millicores == 0.0  # the kubelet's floor of 2 shares (weight 1): no request


def test_vanished_pod_is_left_out_not_an_error(tree: CgroupTree) -> None:
    reader = CgroupCpu(str(tree.root))
    pods = reader.scan()
    tree.remove_pod(UID_B)  # deleted between scan and read
    assert set(reader.read(pods)) == {UID_G, UID_E}
    assert {p.uid for p in reader.scan()} == {UID_G, UID_E}


def test_cpu_time_moves_between_reads(tree: CgroupTree) -> None:
    reader = CgroupCpu(str(tree.root))
    pods = reader.scan()
    tree.set_cpu(UID_B, 4.75)
    assert reader.read(pods)[UID_B] == pytest.approx(4.75)


def test_a_node_without_kubelet_has_no_pods(tmp_path: Path) -> None:
    (tmp_path / "cg").mkdir()
    (tmp_path / "cg" / "cgroup.controllers").write_text("cpu memory\n")
    reader = CgroupCpu(str(tmp_path / "cg"))
    assert reader.scan() == []
    assert "no kubepods" in reader.describe()


def test_missing_tree_is_absent(tmp_path: Path) -> None:
    with pytest.raises(SourceAbsent, match="no cgroup tree"):
        CgroupCpu(str(tmp_path / "nope"))


def test_kubelet_slice_nesting_is_recognised(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    pod = (
        root
        / "kubelet.slice"
        / "kubelet-kubepods.slice"
        / "kubelet-kubepods-burstable.slice"
        / f"kubelet-kubepods-burstable-pod{UID_B.replace('-', '_')}.slice"
    )
    pod.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu\n")
    (pod / "cpu.stat").write_text("usage_usec 2000000\nuser_usec 1\nsystem_usec 1\n")
    reader = CgroupCpu(str(root))
    pods = reader.scan()
    assert [(p.uid, p.qos) for p in pods] == [(UID_B, "burstable")]
    assert reader.read(pods) == {UID_B: 2.0}


@pytest.mark.parametrize(("millicores", "shares"), [(2000, 2048), (500, 512), (250, 256)])
def test_weight_conversion_round_trips_through_the_kubelet(millicores: int, shares: int) -> None:
    weight = 1 + ((shares - 2) * 9999) // 262142
    assert shares_to_millicores(weight_to_shares(weight)) == pytest.approx(millicores, abs=30)


@pytest.mark.parametrize("millicores", [1, 2, 3, 10, 100, 250, 999, 1000, 1024, 4000, 64000, 255999, 256000])
def test_a_pod_cgroups_weight_reads_back_as_the_kubelets_own_shares(millicores: int) -> None:
    """The kubelet writes a pod's cgroup weight with its linear conversion (getCPUWeight,
    pkg/kubelet/cm/cgroup_manager_linux.go) and reads it back with cpuWeightToCPUShares; the
    agent's reading truncated as the kubelet's is the kubelet's own figure. With the runtimes'
    log-quadratic conversion (runc >= 1.3.2, containers only) 1 CPU would be weight 100, which
    this reads as 2,536 millicores: the test tells the two apart."""
    shares = min(max(millicores * 1024 // 1000, 2), 262144)  # MilliCPUToShares
    weight = 10000 if shares >= 262144 else 1 + ((shares - 2) * 9999) // 262142  # getCPUWeight
    kubelet_shares = ((weight - 1) * 262142) // 9999 + 2  # cpuWeightToCPUShares
    assert int(weight_to_shares(weight)) == kubelet_shares
    assert shares - 27 <= weight_to_shares(weight) <= shares  # one weight step is 26.2 shares


def test_proc_stat_busy_and_idle(tmp_path: Path) -> None:
    proc = ProcTree(tmp_path / "proc", cpus=4)
    proc.set_stat(busy_seconds=123.45, idle_seconds=1000.0)
    times = ProcStat(str(tmp_path / "proc")).read()
    assert times.busy_seconds == pytest.approx(123.45)
    assert times.idle_seconds == pytest.approx(1000.0)
    assert times.cpus == 4


def test_proc_stat_counts_irq_softirq_and_steal_as_busy() -> None:
    text = "cpu  100 10 50 1000 20 5 5 10 7 0\ncpu0 100 10 50 1000 20 5 5 10 7 0\n"
    times = parse_proc_stat(text)
    assert times.busy_seconds == pytest.approx((100 + 10 + 50 + 5 + 5 + 10) / 100)
    assert times.idle_seconds == pytest.approx(10.2)


@pytest.mark.parametrize(
    "text", ["intr 1 2\n", "cpu  a b c d\n", "cpu  1 2\n"], ids=["no cpu line", "not numbers", "too few fields"]
)
def test_malformed_proc_stat_is_a_clear_failure(text: str) -> None:
    with pytest.raises(SourceFailed, match="/proc/stat"):
        parse_proc_stat(text)


@pytest.mark.parametrize(
    "text",
    [
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_B.replace('-', '_')}.slice/cri-containerd-abc.scope\n",
        f"12:cpu,cpuacct:/kubepods/burstable/pod{UID_B}/0123abcd\n11:memory:/kubepods/burstable/pod{UID_B}/0123abcd\n1:name=systemd:/\n",
        f"0::/kubepods/pod{UID_B}/0123abcd\n",
    ],
    ids=["v2 systemd", "v1 cgroupfs", "v2 cgroupfs guaranteed"],
)
def test_pod_of_a_process(text: str) -> None:
    assert pod_uid_from_cgroup_text(text) == UID_B


def test_process_outside_pods_and_exited_process(tmp_path: Path) -> None:
    proc = ProcTree(tmp_path / "proc")
    proc.add_process(42, "0::/system.slice/containerd.service\n")
    assert pod_uid_of_pid(str(tmp_path / "proc"), 42) is None
    assert pod_uid_of_pid(str(tmp_path / "proc"), 43) is None


STATIC = "6d7e0f4a9b8c7d6e5f4a3b2c1d0e9f8a"  # a static pod's UID: the kubelet's md5 of its manifest


def test_a_static_pods_cgroup_is_found_by_its_kubelet_uid(tree: CgroupTree) -> None:
    tree.add_pod(STATIC, "burstable", cpu_seconds=7.0, requests_millicores=250)
    reader = CgroupCpu(str(tree.root))
    pods = {p.uid: p for p in reader.scan()}
    assert STATIC in pods and reader.read([pods[STATIC]])[STATIC] == pytest.approx(7.0)
    text = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC}.slice/cri-containerd-{'a' * 64}.scope\n"
    assert pod_uid_from_cgroup_text(text) == STATIC
    assert pod_uid_from_cgroup_text(f"0::/system.slice/podman-{'b' * 64}.scope\n") is None
