"""Node CPU time from ``/proc/stat`` and a process's pod from ``/proc/<pid>/cgroup``.

``/proc/stat``'s first line sums every CPU, in USER_HZ ticks::

    cpu  user nice system idle iowait irq softirq steal guest guest_nice

Busy time is user + nice + system + irq + softirq + steal (guest time is already inside user);
idle is idle + iowait. Each ``cpuN`` line is one logical CPU that is online.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources.cgroup_cpu import POD_UID

try:
    USER_HZ = float(os.sysconf("SC_CLK_TCK"))
except (ValueError, OSError, AttributeError):  # pragma: no cover - every Linux has it
    USER_HZ = 100.0

_POD_UID = re.compile(rf"pod({POD_UID})(?![0-9a-fA-F])")


@dataclass(frozen=True, slots=True)
class CpuTimes:
    busy_seconds: float  # summed over all CPUs
    idle_seconds: float
    cpus: int  # logical CPUs online


def parse_proc_stat(text: str, where: str = "/proc/stat") -> CpuTimes:
    busy = idle = None
    cpus = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            fields = line.split()[1:]
            try:
                ticks = [int(f) for f in fields]
            except ValueError as err:
                raise SourceFailed(f"{where}: malformed cpu line {line[:80]!r}") from err
            if len(ticks) < 4:
                raise SourceFailed(f"{where}: cpu line has {len(ticks)} fields, expected at least 4")
            ticks += [0] * (8 - len(ticks))
            user, nice, system, idle_t, iowait, irq, softirq, steal = ticks[:8]
            busy = (user + nice + system + irq + softirq + steal) / USER_HZ
            idle = (idle_t + iowait) / USER_HZ
        elif line.startswith("cpu") and line[3:4].isdigit():
            cpus += 1
    if busy is None or idle is None:
        raise SourceFailed(f"{where}: no aggregate 'cpu' line")
    return CpuTimes(busy, idle, max(cpus, 1))


class ProcStat:
    def __init__(self, procfs_root: str) -> None:
        self.path = os.path.join(procfs_root, "stat")
        if not os.path.isfile(self.path):
            raise SourceAbsent(f"procfs: no {self.path} (mount the host's /proc)")

    def read(self) -> CpuTimes:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as err:
            raise SourceFailed(f"procfs ({self.path}): cannot open: {err.strerror or err}") from err
        try:
            chunks = []
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(fd)
        return parse_proc_stat(b"".join(chunks).decode("ascii", "replace"), self.path)


def pod_uid_from_cgroup_text(text: str) -> str | None:
    """The pod UID in a ``/proc/<pid>/cgroup`` file (v1 or v2, either driver), or None."""
    match = _POD_UID.search(text)
    return match.group(1).replace("_", "-").lower() if match else None


def pod_uid_of_pid(procfs_root: str, pid: int) -> str | None:
    """The pod a process belongs to, or None (not in a pod, or the process has exited)."""
    try:
        with open(os.path.join(procfs_root, str(pid), "cgroup"), encoding="ascii", errors="replace") as f:
            return pod_uid_from_cgroup_text(f.read())
    except OSError:
        return None


__all__ = ["USER_HZ", "CpuTimes", "ProcStat", "parse_proc_stat", "pod_uid_from_cgroup_text", "pod_uid_of_pid"]
