"""Exact replicas of the kernel trees the agent reads, built in a temporary directory.

The file names, contents and layouts are those of Linux (powercap ``intel_rapl_common``,
cgroup v1/v2 as the kubelet lays them out with either driver, procfs); states git cannot hold
(a wrap between two reads, an unreadable file) are made by the tests through these helpers.
Used by the tests and by ``bench/agent_overhead.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MAX_UJ = 262143328850  # a typical Intel package's max_energy_range_uj


def _write(path: Path, text: str) -> None:
    """Change a file in place, as the kernel's files change: a reader holding it open sees the
    new value when it reads again from offset 0 (one write call, so a reader in another process
    sees the old or the new content, practically never half of each)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


@dataclass
class PowercapTree:
    """``<sysfs>/class/powercap`` with intel-rapl zones."""

    sysfs: Path
    zones: dict[str, int] = field(default_factory=dict)  # entry -> max_energy_range_uj

    def __post_init__(self) -> None:
        self.base = self.sysfs / "class" / "powercap"
        self.base.mkdir(parents=True, exist_ok=True)
        _write(self.base / "intel-rapl" / "enabled", "1\n")  # the control type, not a zone

    def add(
        self,
        entry: str,
        name: str,
        energy_uj: int = 0,
        max_uj: int | None = DEFAULT_MAX_UJ,
        max_power_uw: int | None = None,
        tdp_uw: int | None = None,
    ) -> Path:
        """A zone; ``max_power_uw``: its short-term constraint's maximum (PL2's MAX_POWER),
        ``tdp_uw``: its long-term constraint's (PL1's, the thermal design power)."""
        zone = self.base / entry
        _write(zone / "name", name + "\n")
        _write(zone / "energy_uj", f"{energy_uj}\n")
        _write(zone / "enabled", "1\n")
        _write(zone / "constraint_0_name", "long_term\n")
        _write(zone / "constraint_0_power_limit_uw", "125000000\n")
        if max_uj is not None:
            _write(zone / "max_energy_range_uj", f"{max_uj}\n")
        if tdp_uw is not None:
            _write(zone / "constraint_0_max_power_uw", f"{tdp_uw}\n")
        if max_power_uw is not None:
            _write(zone / "constraint_1_name", "short_term\n")
            _write(zone / "constraint_1_max_power_uw", f"{max_power_uw}\n")
        self.zones[entry] = max_uj or 0
        return zone

    def server(self, sockets: int = 2, dram: bool = True) -> PowercapTree:
        """A two-socket Intel server: package-N with core and dram sub-zones."""
        for s in range(sockets):
            self.add(f"intel-rapl:{s}", f"package-{s}")
            self.add(f"intel-rapl:{s}:0", "core")
            if dram:
                self.add(f"intel-rapl:{s}:1", "dram", max_uj=65712999613)
        return self

    def energy(self, entry: str) -> int:
        return int((self.base / entry / "energy_uj").read_text())

    def set(self, entry: str, energy_uj: int) -> None:
        _write(self.base / entry / "energy_uj", f"{energy_uj}\n")

    def advance(self, entry: str, joules: float) -> None:
        """Add energy, wrapping at max_energy_range_uj exactly as the hardware counter does."""
        maximum = self.zones.get(entry) or 0
        value = self.energy(entry) + round(joules * 1e6)
        if maximum:
            value %= maximum
        self.set(entry, value)

    def remove(self, entry: str) -> None:
        zone = self.base / entry
        for child in zone.iterdir():
            child.unlink()
        zone.rmdir()
        self.zones.pop(entry, None)


V2_STAT = """usage_usec {usec}
user_usec {user}
system_usec {system}
core_sched.force_idle_usec 0
nr_periods 0
nr_throttled 0
throttled_usec 0
nr_bursts 0
burst_usec 0
"""


def millicores_to_shares(millicores: float) -> int:
    return max(2, int(millicores * 1024 // 1000))


def shares_to_weight(shares: int) -> int:
    return 1 + ((shares - 2) * 9999) // 262142


@dataclass
class CgroupTree:
    """The kubelet's pod cgroups, v1 or v2, cgroupfs or systemd driver."""

    root: Path
    version: int = 2
    driver: str = "systemd"
    pods: dict[str, tuple[str, Path]] = field(default_factory=dict)  # uid -> (qos, pod dir in the accounting tree)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.version == 2:
            _write(self.root / "cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
            self.acct = self.root
            self.cpu = self.root
        else:
            self.acct = self.root / "cpu,cpuacct"
            self.cpu = self.acct
            self.acct.mkdir(parents=True, exist_ok=True)
            for link in ("cpu", "cpuacct"):
                if not (self.root / link).exists():
                    (self.root / link).symlink_to("cpu,cpuacct")
            _write(self.acct / "cpuacct.usage", "0\n")
        kube = self.acct / ("kubepods.slice" if self.driver == "systemd" else "kubepods")
        kube.mkdir(parents=True, exist_ok=True)
        self.kubepods = kube
        for qos in ("burstable", "besteffort"):
            self._qos_dir(qos).mkdir(parents=True, exist_ok=True)
        # a system slice outside kubepods, as on a real node (must be ignored)
        _write(
            self.acct / "system.slice" / "kubelet.service" / ("cpu.stat" if self.version == 2 else "cpuacct.usage"),
            "0\n",
        )

    def _qos_dir(self, qos: str) -> Path:
        if qos == "guaranteed":
            return self.kubepods
        if self.driver == "systemd":
            return self.kubepods / f"kubepods-{qos}.slice"
        return self.kubepods / qos

    def _pod_dir(self, uid: str, qos: str) -> Path:
        if self.driver == "systemd":
            u = uid.replace("-", "_")
            prefix = "kubepods" if qos == "guaranteed" else f"kubepods-{qos}"
            return self._qos_dir(qos) / f"{prefix}-pod{u}.slice"
        return self._qos_dir(qos) / f"pod{uid}"

    def container_dir(self, uid: str, container_id: str) -> Path:
        _, pod = self.pods[uid]
        if self.driver == "systemd":
            return pod / f"cri-containerd-{container_id}.scope"
        return pod / container_id

    def cgroup_path(self, uid: str, container_id: str) -> str:
        """The path of a container's cgroup as /proc/<pid>/cgroup shows it."""
        return "/" + str(self.container_dir(uid, container_id).relative_to(self.acct))

    def add_pod(
        self,
        uid: str,
        qos: str = "burstable",
        cpu_seconds: float = 0.0,
        requests_millicores: float = 100,
        containers: int = 1,
    ) -> Path:
        pod = self._pod_dir(uid, qos)
        pod.mkdir(parents=True, exist_ok=True)
        self.pods[uid] = (qos, pod)
        shares = 2 if qos == "besteffort" else millicores_to_shares(requests_millicores)
        if self.version == 2:
            _write(pod / "cpu.weight", f"{shares_to_weight(shares)}\n")
        else:
            _write(pod / "cpu.shares", f"{shares}\n")
        for i in range(containers):
            cdir = self.container_dir(uid, f"{i:064x}")
            cdir.mkdir(parents=True, exist_ok=True)
            self._write_usage(cdir, cpu_seconds / max(containers, 1))
        self.set_cpu(uid, cpu_seconds)
        return pod

    def _write_usage(self, directory: Path, seconds: float) -> None:
        if self.version == 2:
            usec = round(seconds * 1e6)
            _write(directory / "cpu.stat", V2_STAT.format(usec=usec, user=usec * 3 // 4, system=usec - usec * 3 // 4))
        else:
            _write(directory / "cpuacct.usage", f"{round(seconds * 1e9)}\n")

    def set_cpu(self, uid: str, seconds: float) -> None:
        self._write_usage(self.pods[uid][1], seconds)

    def remove_pod(self, uid: str) -> None:
        _, pod = self.pods.pop(uid)
        for path in sorted(pod.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        pod.rmdir()


@dataclass
class ProcTree:
    """``/proc/stat``, ``/proc/cpuinfo`` and ``/proc/<pid>/cgroup``."""

    root: Path
    cpus: int = 8
    hz: int = 100

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.set_stat(0.0, 0.0)

    def set_stat(self, busy_seconds: float, idle_seconds: float) -> None:
        busy = round(busy_seconds * self.hz)
        idle = round(idle_seconds * self.hz)
        user, system = busy * 7 // 10, busy - busy * 7 // 10
        lines = [f"cpu  {user} 0 {system} {idle} 0 0 0 0 0 0"]
        for i in range(self.cpus):
            lines.append(f"cpu{i} {user // self.cpus} 0 {system // self.cpus} {idle // self.cpus} 0 0 0 0 0 0")
        lines += [
            "intr 1000 0 0",
            "ctxt 123456",
            "btime 1764400000",
            "processes 4242",
            "procs_running 2",
            "procs_blocked 0",
            "softirq 10 0 0 0",
        ]
        _write(self.root / "stat", "\n".join(lines) + "\n")

    def add_process(self, pid: int, cgroup_text: str) -> None:
        _write(self.root / str(pid) / "cgroup", cgroup_text)

    def set_cpuinfo(
        self,
        vendor: str,
        family: int,
        model: int,
        packages: int = 1,
        cores_per_package: int = 2,
        threads: int = 2,
        model_name: str = "replica",
        flags: str = "fpu msr rapl",
    ) -> None:
        blocks = []
        cpu = 0
        for package in range(packages):
            for core in range(cores_per_package):
                for _ in range(threads):
                    blocks.append(
                        f"processor\t: {cpu}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
                        f"model name\t: {model_name}\nphysical id\t: {package}\nsiblings\t: {cores_per_package * threads}\n"
                        f"core id\t\t: {core}\nflags\t\t: {flags}\n"
                    )
                    cpu += 1
        _write(self.root / "cpuinfo", "\n".join(blocks) + "\n")


def write_msr(dev: Path, cpu: int, values: dict[int, int]) -> Path:
    """A sparse file standing in for /dev/cpu/N/msr: 8 little-endian bytes at each offset."""
    path = dev / "cpu" / str(cpu) / "msr"
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "r+b" if path.exists() else "w+b"
    with open(path, mode) as f:
        for offset, value in values.items():
            f.seek(offset)
            f.write(value.to_bytes(8, "little"))
    return path


class MsrEmulator:
    """The msr driver's semantics: file offset N reads register N (8 bytes), whatever N's
    neighbours hold. A sparse file cannot stand in when registers are adjacent (AMD's
    0xC001029A core and 0xC001029B package energy), so reads are answered from this map,
    keyed by the device file the descriptor points to."""

    def __init__(self, dev: Path) -> None:
        self.dev = dev
        self.registers: dict[str, dict[int, int]] = {}

    def set(self, cpu: int, values: dict[int, int]) -> None:
        path = self.dev / "cpu" / str(cpu) / "msr"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        self.registers.setdefault(os.path.realpath(path), {}).update(values)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        path = os.readlink(f"/proc/self/fd/{fd}")
        registers = self.registers.get(path, {})
        if offset not in registers:
            raise OSError(5, "Input/output error")  # what the driver answers for an unknown MSR
        return registers[offset].to_bytes(8, "little")[:size]


__all__ = [
    "DEFAULT_MAX_UJ",
    "CgroupTree",
    "MsrEmulator",
    "PowercapTree",
    "ProcTree",
    "millicores_to_shares",
    "shares_to_weight",
    "write_msr",
]
