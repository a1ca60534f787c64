"""The agent under faults (issue 12): counter faults on a replica powercap tree, and hostile HTTP
clients against the real agent on loopback. Prints each case's verdict and figures.

Counter cases run the meter in-process on a replica tree with a fake clock (the scenarios of
``tests/measurement/test_counter_faults.py``); window traffic and the HTTP cases run the real
agent (``python -m joulesched agent``) as its own process on a replica node, with a token.

    PYTHONPATH=. python bench/agent_faults.py

Not a timed test: run it by hand and record the figures in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from joulesched.contracts.net import free_port
from joulesched.measurement.meter import EnergyMeter
from joulesched.measurement.sources.base import Roots
from joulesched.measurement.sources.registry import open_sources
from tests.measurement import test_counter_faults as faults
from tests.measurement.fakes import FakeClock
from tests.measurement.replica import CgroupTree, PowercapTree, ProcTree

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"

COUNTER_CASES = [
    ("plain wrap", faults.plain_wrap, set()),
    ("wrap near the real maximum", faults.wrap_near_the_maximum, set()),
    ("reset after vanish", faults.reset_after_vanish, {"reset"}),
    ("backwards after unreadable stretch", faults.backwards_after_unreadable, {"reset"}),
    ("garbage 2^64-1 then 0", faults.garbage_then_zero, {"garbage", "reset"}),
    ("coarse 70 J steps, reads 1-10 ms apart", faults.coarse_steps_read_often, set()),
]


def counter_cases() -> bool:
    ok_all = True
    print("## counters (replica powercap tree, fake clock)")
    print("| case | truth (J) | counted (J) | invented (J) | dropped (J) | anomalies | discarded s | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for name, scenario, kinds in COUNTER_CASES:
        with tempfile.TemporaryDirectory(prefix="joulesched-faults-") as tmp:
            roots = Roots(sysfs=f"{tmp}/sys", procfs=f"{tmp}/proc", cgroup=f"{tmp}/cgroup", dev=f"{tmp}/dev")
            tree = PowercapTree(Path(roots.sysfs))
            tree.add(faults.ENTRY, "package-0")
            clock = FakeClock()
            meter = EnergyMeter(open_sources(("rapl_sysfs",), {}, roots, clock).sources, clock=clock, rescan_seconds=1e9)
            rig = faults.Rig(tree, clock, meter)
            scenario(rig)
            counted = rig.read()
            got = {k for (_, _, k) in meter.anomalies}
            invented = max(counted - rig.truth, 0.0)
            dropped = max(rig.truth - counted, 0.0)
            ok = invented < 1e-6 and got == kinds and (bool(kinds) or dropped <= 70.0)
            ok_all &= ok
            counts = ", ".join(f"{k} {c}" for (_, _, k), c in sorted(meter.anomalies.items())) or "none"
            print(
                f"| {name} | {rig.truth:.1f} | {counted:.1f} | {invented:.1f} | {dropped:.1f} | {counts} "
                f"| {sum(meter.discarded_seconds.values()):.0f} | {'ok' if ok else 'FAIL'} |"
            )
    return ok_all


# -- the real agent on loopback ---------------------------------------------------------------


class Agent:
    def __init__(self, base: Path) -> None:
        self.powercap = PowercapTree(base / "sys")
        self.powercap.add("intel-rapl:0", "package-0")
        CgroupTree(base / "cgroup", version=2, driver="systemd")
        ProcTree(base / "proc", cpus=4)
        (base / "token").write_text(TOKEN + "\n")
        config = base / "agent.yaml"
        config.write_text(
            f'kubernetes: {{mode: "off"}}\nsources: {{order: [rapl_sysfs]}}\nserver: {{token_file: "{base / "token"}"}}\n'
        )
        self.port = free_port()
        cmd = [
            sys.executable, "-m", "joulesched", "agent", "--config", str(config), "--node-name", "bench",
            "--listen", f"127.0.0.1:{self.port}", "--interval", "1", "--log-level", "error",
            "--sysfs-root", str(base / "sys"), "--procfs-root", str(base / "proc"), "--cgroup-root", str(base / "cgroup"),
        ]  # fmt: skip
        self.process = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the agent exited with code {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the agent did not become healthy in 30 s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def status(self, field: str) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        return -1

    def request(self, method: str, path: str) -> tuple[int, dict[str, object]]:
        req = urllib.request.Request(self.url + path, data=b"{}" if method == "POST" else None, method=method)
        req.add_header("Authorization", f"Bearer {TOKEN}")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            with err:
                return err.code, json.loads(err.read())

    def connect(self, timeout: float = 10.0) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def raw(self, data: bytes) -> str:
        with self.connect() as sock:
            sock.sendall(data)
            try:
                reply = sock.recv(4096)
            except TimeoutError:
                return "no reply (timeout)"
        return reply.split(b"\r\n", 1)[0].decode() if reply else "closed, no reply"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=20)


def window_traffic(agent: Agent) -> bool:
    """A coarse counter (70 J every 100 ms) while 8 clients open and close windows."""
    print("\n## window traffic (real agent, coarse counter: 70 J every 100 ms, 8 window clients)")
    stop = threading.Event()
    calls = [0]

    def client() -> None:
        while not stop.is_set():
            status, doc = agent.request("POST", "/v1/windows")
            if status == 201:
                agent.request("DELETE", f"/v1/windows/{doc['id']}")
                calls[0] += 2

    status, doc = agent.request("POST", "/v1/windows")
    assert status == 201, doc
    clients = [threading.Thread(target=client, daemon=True) for _ in range(8)]
    for t in clients:
        t.start()
    steps = 50
    started = time.monotonic()
    for i in range(steps):
        time.sleep(max(started + (i + 1) * 0.1 - time.monotonic(), 0.0))
        agent.powercap.advance("intel-rapl:0", 70.0)
    time.sleep(0.15)
    stop.set()
    for t in clients:
        t.join(timeout=10)
    _, result = agent.request("DELETE", f"/v1/windows/{doc['id']}")
    zones = result["zones"]
    assert isinstance(zones, dict)
    counted = float(zones["rapl_sysfs/package-0"])
    truth = steps * 70.0
    ok = abs(counted - truth) <= 70.0
    print(f"truth {truth:.0f} J, counted {counted:.0f} J ({100 * (truth - counted) / truth:.1f} % dropped), "
          f"{calls[0]} window calls in {steps * 0.1:.0f} s: {'ok' if ok else 'FAIL'}")  # fmt: skip
    return ok


def http_cases(agent: Agent) -> bool:
    ok_all = True
    print("\n## HTTP (real agent on loopback, token configured)")
    auth = f"Authorization: Bearer {TOKEN}\r\n"
    nested = b"[" * 30_000 + b"]" * 30_000
    bad_utf8 = b'{"label": "\xff"}'

    def post(headers: str, body: bytes = b"") -> bytes:
        return f"POST /v1/windows HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode() + body

    print("| case | reply | verdict |")
    print("|---|---|---|")
    for name, data, want in [
        ("Content-Length: -1", post(auth + "Content-Length: -1\r\n"), "400"),
        ("Content-Length: abc", post(auth + "Content-Length: abc\r\n"), "400"),
        ("JSON nested 30,000 deep", post(auth + f"Content-Length: {len(nested)}\r\n", nested), "400"),
        ("invalid UTF-8", post(auth + f"Content-Length: {len(bad_utf8)}\r\n", bad_utf8), "400"),
        ("100 kB body", post(auth + "Content-Length: 100000\r\n"), "413"),
    ]:
        reply = agent.raw(data)
        ok = f" {want} " in f" {reply} "
        ok_all &= ok
        print(f"| {name} | {reply} | {'ok' if ok else 'FAIL'} |")

    # 128 MB streamed without a token
    size = 128 * 1024 * 1024
    rss0 = agent.status("VmRSS")
    piece = b"x" * 65536
    sent = [0]
    with agent.connect() as sock:

        def send() -> None:
            try:
                sock.sendall(post(f"Content-Length: {size}\r\n"))
                for _ in range(size // len(piece)):
                    sock.sendall(piece)
                    sent[0] += len(piece)
            except OSError:
                pass

        sender = threading.Thread(target=send, daemon=True)
        started = time.monotonic()
        sender.start()
        reply = sock.recv(4096).split(b"\r\n", 1)[0].decode()
        answered = time.monotonic() - started
        sender.join(timeout=30)
    hwm = agent.status("VmHWM")
    ok = "401" in reply and (hwm - rss0) < 16 * 1024
    ok_all &= ok
    print(f"\n128 MB without a token: {reply!r} after {answered * 1000:.0f} ms, {sent[0] / 2**20:.1f} MB accepted "
          f"by the socket before it closed; agent RSS {rss0 / 1024:.0f} MB → peak {hwm / 1024:.0f} MB: "
          f"{'ok' if ok else 'FAIL'}")  # fmt: skip

    # 2,000 idle connections
    threads0 = agent.status("Threads")
    idle = [agent.connect() for _ in range(2000)]
    time.sleep(1.0)
    threads1 = agent.status("Threads")
    started = time.monotonic()
    with urllib.request.urlopen(f"{agent.url}/healthz", timeout=10) as r:
        health = r.status
    latency = time.monotonic() - started
    for sock in idle:
        sock.close()
    ok = threads1 - threads0 <= 20 and health == 200 and latency < 1.0
    ok_all &= ok
    print(f"2,000 idle connections: agent threads {threads0} → {threads1}; /healthz {health} in "
          f"{latency * 1000:.0f} ms: {'ok' if ok else 'FAIL'}")  # fmt: skip
    return ok_all


def main() -> int:
    logging.basicConfig(level=logging.ERROR)  # the meter's one-off anomaly warnings are the point here
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}\n")
    ok = counter_cases()
    with tempfile.TemporaryDirectory(prefix="joulesched-faults-") as tmp:
        agent = Agent(Path(tmp))
        try:
            ok &= window_traffic(agent)
            ok &= http_cases(agent)
        finally:
            agent.stop()
    print("\nall cases ok" if ok else "\nSOME CASES FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
