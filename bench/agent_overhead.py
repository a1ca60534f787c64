"""Agent overhead: CPU seconds per wall second and peak RSS, on a replica node with many pods.

Builds a replica of a two-socket node (powercap RAPL tree, cgroup v2 with the systemd driver and
``--pods`` pods in all three QoS classes, /proc/stat), starts the real agent
(``python -m joulesched agent``) on it as a separate process, keeps the counters and the pods'
CPU time moving once a second from this process, scrapes /metrics every 15 s as Prometheus
would, and measures the agent process only: utime + stime from /proc/<pid>/stat over the
measured span, and VmHWM (peak resident set) from /proc/<pid>/status.

    python bench/agent_overhead.py                          # 1 s and 100 ms, 200 pods, 25 s each
    python bench/agent_overhead.py --intervals 1 --duration 60 --pods 500

Targets: <= 0.5 % of one core at 1 s, <= 5 % at 100 ms, <= 60 MB RSS.
Not a timed test: run it by hand and record the figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from joulesched.contracts.net import free_port

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {1.0: 0.005, 0.1: 0.05}
RSS_TARGET_MB = 60.0


def _replica_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("replica", ROOT / "tests" / "measurement" / "replica.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["replica"] = module
    spec.loader.exec_module(module)
    return module


def build_node(base: Path, pods: int) -> tuple[object, object, object, list[str]]:
    replica = _replica_module()
    powercap = replica.PowercapTree(base / "sys").server(sockets=2)
    cgroup = replica.CgroupTree(base / "cgroup", version=2, driver="systemd")
    proc = replica.ProcTree(base / "proc", cpus=64)
    uids = []
    for i in range(pods):
        uid = str(uuid.UUID(int=i + 1, version=4))
        qos = ("guaranteed", "burstable", "besteffort")[i % 3]
        cgroup.add_pod(uid, qos, cpu_seconds=0.0, requests_millicores=250 + 10 * i, containers=2)
        uids.append(uid)
    return powercap, cgroup, proc, uids


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(interval: float, duration: float, pods: int, warmup: float, profile: str = "") -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="joulesched-bench-") as tmp:
        base = Path(tmp)
        powercap, cgroup, proc, uids = build_node(base, pods)
        config = base / "agent.yaml"
        config.write_text('kubernetes: {mode: "off"}\nsources: {order: [rapl_sysfs]}\n')
        port = free_port()
        cmd = [
            sys.executable, *(["-m", "cProfile", "-o", profile] if profile else []), "-m", "joulesched", "agent", "--config", str(config), "--node-name", "bench",
            "--listen", f"127.0.0.1:{port}", "--interval", str(interval), "--log-level", "warning",
            "--sysfs-root", str(base / "sys"), "--procfs-root", str(base / "proc"), "--cgroup-root", str(base / "cgroup"),
        ]  # fmt: skip
        agent = subprocess.Popen(cmd, cwd=ROOT)
        stop = threading.Event()

        def drive() -> None:  # the node moves on: energy, pod CPU time, /proc/stat
            busy = 0.0
            while not stop.wait(1.0):
                for s in (0, 1):
                    powercap.advance(f"intel-rapl:{s}", 150.0)  # type: ignore[attr-defined]
                    powercap.advance(f"intel-rapl:{s}:0", 100.0)  # type: ignore[attr-defined]
                    powercap.advance(f"intel-rapl:{s}:1", 12.0)  # type: ignore[attr-defined]
                busy += 20.0
                for i, uid in enumerate(uids):
                    cgroup.set_cpu(uid, busy * (i % 7) / 100.0)  # type: ignore[attr-defined]
                proc.set_stat(busy, 44.0 * time.monotonic())  # type: ignore[attr-defined]

        def scrape() -> None:  # Prometheus every 15 s
            while not stop.wait(15.0):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                        r.read()
                except OSError:
                    pass

        threads = [threading.Thread(target=drive, daemon=True), threading.Thread(target=scrape, daemon=True)]
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if agent.poll() is not None:
                    raise RuntimeError(f"the agent exited with code {agent.returncode}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.2)
            else:
                raise RuntimeError("the agent did not become healthy in 30 s")
            for t in threads:
                t.start()
            time.sleep(warmup)
            cpu0, wall0 = cpu_seconds(agent.pid), time.monotonic()
            time.sleep(duration)
            cpu1, wall1 = cpu_seconds(agent.pid), time.monotonic()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            pod_series = text.count("joulesched_pod_cpu_seconds_total{")
            rss = peak_rss_mb(agent.pid)
        finally:
            stop.set()
            agent.terminate()
            agent.wait(timeout=20)
        return {
            "interval": interval,
            "cpu_fraction": (cpu1 - cpu0) / (wall1 - wall0),
            "rss_mb": rss,
            "pods_seen": pod_series,
            "seconds": wall1 - wall0,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", default="1,0.1", help="comma-separated sampling intervals in seconds")
    parser.add_argument("--duration", type=float, default=25.0, help="measured seconds per interval")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument(
        "--profile", metavar="FILE", default="", help="run the agent under cProfile, stats to FILE.<interval>"
    )
    args = parser.parse_args()
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {args.pods} pods"
    )
    print("| interval | CPU (% of one core) | target | peak RSS (MB) | target | pods exported |")
    print("|---|---|---|---|---|---|")
    ok = True
    for text in args.intervals.split(","):
        interval = float(text)
        r = run(interval, args.duration, args.pods, args.warmup, f"{args.profile}.{text}" if args.profile else "")
        target = TARGETS.get(interval)
        cpu_ok = target is None or r["cpu_fraction"] <= target
        rss_ok = r["rss_mb"] <= RSS_TARGET_MB
        ok &= cpu_ok and rss_ok
        target_text = f"≤ {target * 100:g} %" if target is not None else "—"
        print(
            f"| {interval:g} s | {r['cpu_fraction'] * 100:.2f} % {'✓' if cpu_ok else '✗'} | {target_text} "
            f"| {r['rss_mb']:.1f} {'✓' if rss_ok else '✗'} | ≤ {RSS_TARGET_MB:g} | {r['pods_seen']} |"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
