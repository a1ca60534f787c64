"""CPU cost of one IPMI power read, ipmitool against FreeIPMI through the agent's own
``ipmi_dcmi`` source against the simulated lanplus BMC of the tests (pyghmi, loopback).

Reads alternate between the two tools (interleaved, so machine load hits both alike); the CPU
time of each read is the change of ``RUSAGE_CHILDREN`` (user + system) across it, the wall time
its duration. The simulated BMC is a child that stays alive, so its own CPU is not counted.

    PYTHONPATH=. python bench/ipmi_cost.py [READS]

Not a timed test: run it by hand and record the figures in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from joulesched.measurement.sources import ipmi_dcmi
from joulesched.measurement.sources.base import Roots
from tests.measurement.sources.ipmi_support import BMC_SIM, DELL_LIKE_SENSORS, PASSWORD, USER


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    reads = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    for tool in ("ipmitool", "ipmi-dcmi"):
        version = subprocess.run([tool, "-V"], capture_output=True, text=True, check=False)
        print(f"# {tool}: {(version.stdout + version.stderr).strip().splitlines()[0]}")
    with tempfile.TemporaryDirectory(prefix="joulesched-ipmi-cost-") as tmp:
        state = Path(tmp) / "state.json"
        dcmi = {"mode": "active", "current": 231, "minimum": 180, "maximum": 402, "average": 250, "period_ms": 1000}
        state.write_text(json.dumps({"users": {USER: PASSWORD}, "dcmi": dcmi, "sensors": DELL_LIKE_SENSORS}))
        password = Path(tmp) / "password"
        password.write_text(PASSWORD + "\n")
        bmc = subprocess.Popen([sys.executable, str(BMC_SIM), str(state)], stdout=subprocess.PIPE, text=True)
        try:
            assert bmc.stdout is not None
            ready, _, _ = select.select([bmc.stdout], [], [], 15)
            port = int(bmc.stdout.readline().split()[1]) if ready else 0
            options = {"host": "127.0.0.1", "port": port, "username": USER, "password_file": str(password)}
            sources = {
                tool: ipmi_dcmi.open_source({**options, "tool": tool}, Roots()) for tool in ("ipmitool", "freeipmi")
            }
            cpu: dict[str, list[float]] = {tool: [] for tool in sources}
            wall: dict[str, list[float]] = {tool: [] for tool in sources}
            for _ in range(reads):
                for tool, source in sources.items():
                    c0, w0 = _children_cpu(), time.perf_counter()
                    watts = source.zones()[0].read().value
                    cpu[tool].append(_children_cpu() - c0)
                    wall[tool].append(time.perf_counter() - w0)
                    assert watts == 231, watts
            for source in sources.values():
                source.close()
        finally:
            bmc.terminate()
            bmc.wait(timeout=10)
    print(f"\n{reads} reads per tool, interleaved\n")
    print(
        "| tool | CPU per read (median) | CPU per read (mean) | wall per read (median) | a core at one read per second |"
    )
    print("|---|---|---|---|---|")
    for tool in cpu:
        median, mean = statistics.median(cpu[tool]), statistics.fmean(cpu[tool])
        print(f"| {tool} | {median * 1000:.1f} ms | {mean * 1000:.1f} ms | {statistics.median(wall[tool]) * 1000:.1f} ms "
              f"| {mean * 100:.2f} % |")  # fmt: skip
    ratio = statistics.fmean(cpu["ipmitool"]) / statistics.fmean(cpu["freeipmi"])
    print(f"\nipmitool / FreeIPMI CPU per read: {ratio:.1f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
