"""Per-pod CPU time from the kubelet's cgroups: v1 and v2, cgroupfs and systemd drivers.

Where the kubelet puts a pod (relative to the cgroup root; v1 under the ``cpuacct`` hierarchy)::

    cgroupfs driver                         systemd driver
    kubepods/pod<uid>/                      kubepods.slice/kubepods-pod<uid_>.slice/          Guaranteed
    kubepods/burstable/pod<uid>/            kubepods.slice/kubepods-burstable.slice/
                                                kubepods-burstable-pod<uid_>.slice/          Burstable
    kubepods/besteffort/pod<uid>/           kubepods.slice/kubepods-besteffort.slice/
                                                kubepods-besteffort-pod<uid_>.slice/         BestEffort

Containers sit one level deeper (``<container-id>/`` or ``cri-containerd-<id>.scope/``); this
module reads the pod level, which sums its containers. The systemd driver writes the UID with
``_`` for ``-``. Also recognised: the ``kubelet.slice/kubelet-kubepods.slice`` nesting (kind,
``--cgroup-root``).

CPU time: v2 ``cpu.stat`` ``usage_usec``; v1 ``cpuacct.usage`` (nanoseconds). CPU requests
come from the weight the kubelet derived from them: v1 ``cpu.shares`` = requests × 1024 / 1000
(at least 2); v2 ``cpu.weight`` = 1 + (shares − 2) × 9999 / 262142, the kubelet's own linear
conversion (``getCPUWeight``, pkg/kubelet/cm, through v1.37), which it writes to the pod's
cgroup itself and reads back the same way. runc ≥ 1.3.2 and crun ≥ 1.23 convert a
*container's* shares by another formula (⌈10^((L² + 125 L) / 612 − 7/34)⌉, L = log₂ shares);
this module reads only the pod's cgroup, so that formula does not reach it.

A pod whose files vanish between scan and read has been deleted: it is left out of the read,
not an error.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from joulesched.measurement.errors import SourceAbsent

# A pod's UID in its cgroup's name: a UUID (dashes as underscores under the systemd driver), or a
# static pod's 32 hex digits (the kubelet's md5 of its manifest; the API's mirror pod carries it
# in its kubernetes.io/config.mirror annotation).
POD_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}|[0-9a-fA-F]{32}"
_POD_DIR = re.compile(rf"pod({POD_UID})(?:\.slice)?$")
KUBEPODS_CANDIDATES = ("kubepods.slice", "kubepods", "kubelet.slice/kubelet-kubepods.slice", "kubelet/kubepods")
V1_CPUACCT = ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")
V1_CPU = ("cpu", "cpu,cpuacct", "cpuacct,cpu")
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")


@dataclass(frozen=True, slots=True)
class PodCgroup:
    uid: str
    qos: str  # guaranteed | burstable | besteffort
    path: str  # the pod's cgroup directory (in the cpuacct hierarchy on v1)
    usage_file: str  # cpu.stat (v2) or cpuacct.usage (v1)
    requests_millicores: float | None  # from cpu.shares / cpu.weight; None when unreadable


MIN_SHARES = 2.0  # the kubelet's floor (MinShares): a pod that requests no CPU, or under 2 millicores


def shares_to_millicores(shares: float) -> float:
    """The CPU request the kubelet wrote as ``shares``; the floor reads as none (a BestEffort
    pod's 2 shares are not a request of 1.95 millicores that takes the idle energy)."""
    return 0.0 if shares <= MIN_SHARES else shares * 1000.0 / 1024.0


def weight_to_shares(weight: float) -> float:
    """The kubelet's inverse of its pod cgroup conversion (``cpuWeightToCPUShares``), unrounded."""
    return 2.0 + (weight - 1.0) * 262142.0 / 9999.0


def _read_text(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


class CgroupCpu:
    """Finds pod cgroups and reads their CPU time."""

    def __init__(self, cgroup_root: str) -> None:
        root = Path(cgroup_root)
        if not root.is_dir():
            raise SourceAbsent(f"cgroup_cpu: no cgroup tree at {root}")
        self.root = root
        cpu_root: Path | None
        if (root / "cgroup.controllers").is_file():
            self.version = 2
            acct_root: Path | None = root
            cpu_root = root
        else:
            self.version = 1
            acct_root = next((root / d for d in V1_CPUACCT if (root / d).is_dir()), None)
            cpu_root = next((root / d for d in V1_CPU if (root / d).is_dir()), None)
            if acct_root is None:
                raise SourceAbsent(f"cgroup_cpu: {root} is neither cgroup v2 nor has a v1 cpuacct hierarchy")
        assert acct_root is not None
        self.acct_root: Path = acct_root
        self.cpu_root = cpu_root
        kubepods = next((acct_root / c for c in KUBEPODS_CANDIDATES if (acct_root / c).is_dir()), None)
        self.kubepods = kubepods  # None on a node without kubelet (e.g. `joulesched measure`)
        self.driver = "systemd" if kubepods is not None and kubepods.name.endswith(".slice") else "cgroupfs"
        self._listing: list[str] = []
        self._fds: dict[str, int] = {}
        self._qos_cache: list[str] | None = None

    def describe(self) -> str:
        where = self.kubepods if self.kubepods is not None else f"{self.acct_root} (no kubepods cgroup)"
        return f"cgroup v{self.version}, {self.driver} driver, pods under {where}"

    def changed(self) -> bool:
        """Whether a pod cgroup came or went since the last call, from three directory listings
        (cheap) instead of a full scan that reads every pod's weight. Directory mtimes cannot be
        used: cgroupfs (kernfs) does not update a parent's mtime when a child is created."""
        if self.kubepods is None:
            return False
        listing: list[str] = []
        for directory in (str(self.kubepods), *self._qos_dirs()):
            try:
                listing += os.listdir(directory)
            except OSError:
                listing.append(f"<gone {directory}>")
        listing.sort()
        if listing == self._listing:
            return False
        self._listing = listing
        return True

    def _qos_dirs(self) -> list[str]:
        if self._qos_cache is None:
            assert self.kubepods is not None
            try:
                self._qos_cache = [
                    e.path
                    for e in os.scandir(self.kubepods)
                    if e.is_dir() and ("burstable" in e.name or "besteffort" in e.name)
                ]
            except OSError:
                return []
        return self._qos_cache

    def scan(self) -> list[PodCgroup]:
        """Every pod cgroup present now, with its QoS class and requests."""
        self._qos_cache = None
        if self.kubepods is None:
            return []
        pods: list[PodCgroup] = []
        try:
            top = list(os.scandir(self.kubepods))
        except OSError:
            return []
        for entry in top:
            if not entry.is_dir(follow_symlinks=False):
                continue
            match = _POD_DIR.search(entry.name)
            if match:
                pods.append(self._pod(entry.path, match.group(1), "guaranteed"))
                continue
            qos = next((q for q in ("burstable", "besteffort") if q in entry.name), None)
            if qos is None:
                continue
            try:
                inner = list(os.scandir(entry.path))
            except OSError:
                continue  # the QoS cgroup vanished between listings
            for pod_entry in inner:
                pod_match = _POD_DIR.search(pod_entry.name)
                if pod_match and pod_entry.is_dir(follow_symlinks=False):
                    pods.append(self._pod(pod_entry.path, pod_match.group(1), qos))
        pods.sort(key=lambda p: p.uid)
        return pods

    def _pod(self, path: str, raw_uid: str, qos: str) -> PodCgroup:
        uid = raw_uid.replace("_", "-").lower()
        usage = os.path.join(path, "cpu.stat" if self.version == 2 else "cpuacct.usage")
        return PodCgroup(uid, qos, path, usage, self._requests(path))

    def _requests(self, path: str) -> float | None:
        if self.version == 2:
            text = _read_text(os.path.join(path, "cpu.weight"))
            if text is None or not text.strip().isdigit():
                return None
            return shares_to_millicores(weight_to_shares(float(text.strip())))
        if self.cpu_root is None:
            return None
        relative = os.path.relpath(path, self.acct_root)
        text = _read_text(os.path.join(self.cpu_root, relative, "cpu.shares"))
        if text is None or not text.strip().isdigit():
            return None
        return shares_to_millicores(float(text.strip()))

    def read(self, pods: list[PodCgroup]) -> dict[str, float]:
        """CPU seconds of each pod since its cgroup was created; vanished pods are left out.

        Each usage file stays open between reads and is read again with ``pread`` at offset 0,
        which makes the kernel generate its content afresh (seq_file restarts at position 0),
        saving an open and a close per pod and interval. A deleted cgroup's open file answers
        ENODEV: the pod is left out and its descriptor closed."""
        out: dict[str, float] = {}
        v2 = self.version == 2
        fds = self._fds
        wanted = set()
        for pod in pods:
            path = pod.usage_file
            wanted.add(path)
            fd = fds.get(path)
            try:
                if fd is None:
                    fd = fds[path] = os.open(path, os.O_RDONLY)
                raw = os.pread(fd, 512, 0)
            except OSError:
                if fd is not None:
                    os.close(fds.pop(path))
                continue  # deleted since the scan
            seconds = _parse_usage(raw, v2)
            if seconds is not None:
                out[pod.uid] = seconds
        if len(fds) > len(wanted):
            for path in [p for p in fds if p not in wanted]:
                os.close(fds.pop(path))
        return out

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __del__(self) -> None:
        fds = getattr(self, "_fds", {})
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        fds.clear()


def _parse_usage(raw: bytes, v2: bool) -> float | None:
    if v2:
        start = raw.find(b"usage_usec ")
        if start < 0:
            return None
        end = raw.find(b"\n", start)
        digits = raw[start + 11 : end if end >= 0 else len(raw)].strip()
        return int(digits) / 1e6 if digits.isdigit() else None
    digits = raw.strip()
    return int(digits) / 1e9 if digits.isdigit() else None


__all__ = ["QOS_CLASSES", "CgroupCpu", "PodCgroup", "shares_to_millicores", "weight_to_shares"]
