"""The agent under faults: counter faults on a replica powercap tree, gaps with load
steps inside, a BMC that goes silent or has the wrong password at start, and hostile HTTP
clients against the real agent on loopback. Prints each case's verdict and figures.

Counter and gap cases run the meter or the sampler in-process on replica trees with a fake
clock (the scenarios of ``tests/measurement/test_counter_faults.py`` and ``test_gaps.py``);
the BMC cases, window traffic and the HTTP cases run the real agent (``python -m joulesched
agent``) as its own process on a replica node, with a token, against the Redfish mockup of the
tests on loopback.

    PYTHONPATH=. python bench/agent_faults.py

Not a timed test: run it by hand and record the figures in docs/benchmarks.md.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
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
            sources = open_sources(("rapl_sysfs",), {}, roots, clock).sources
            # retries at most 1 s apart, as in the tests: every read of the scenario is attempted
            meter = EnergyMeter(sources, clock=clock, rescan_seconds=1e9, retry_max_seconds=1.0)
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
    def __init__(
        self, base: Path, sources: str = "{order: [rapl_sysfs]}", record: Path | None = None, extra: str = ""
    ) -> None:
        self.powercap = PowercapTree(base / "sys")
        self.powercap.add("intel-rapl:0", "package-0")
        CgroupTree(base / "cgroup", version=2, driver="systemd")
        ProcTree(base / "proc", cpus=4)
        (base / "token").write_text(TOKEN + "\n")
        config = base / "agent.yaml"
        config.write_text(
            f'kubernetes: {{mode: "off"}}\nsources: {sources}\nserver: {{token_file: "{base / "token"}"}}\n' + extra
        )
        self.port = free_port()
        cmd = [
            sys.executable, "-m", "joulesched", "agent", "--config", str(config), "--node-name", "bench",
            "--listen", f"127.0.0.1:{self.port}", "--interval", "1", "--log-level", "error",
            "--sysfs-root", str(base / "sys"), "--procfs-root", str(base / "proc"), "--cgroup-root", str(base / "cgroup"),
        ]  # fmt: skip
        if record is not None:
            cmd += ["--record", str(record)]
        self.process = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the agent exited with code {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the agent did not become healthy in 60 s")

    def get(self, path: str) -> tuple[int, str, float]:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as r:
                return r.status, r.read().decode(), time.monotonic() - started
        except urllib.error.HTTPError as err:
            with err:
                return err.code, err.read().decode(), time.monotonic() - started

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

    # 1 GiB streamed without a token
    size = 1 << 30
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
    print(f"\n1 GiB without a token: {reply!r} after {answered * 1000:.0f} ms, {sent[0] / 2**20:.1f} MB accepted "
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


def gap_cases() -> bool:
    """The gap rule (docs/agent.md): a BMC silent 1, 10, 30, 60 s with a 200 → 500 W step inside,
    and a RAPL zone that vanishes 30 s and comes back reset, on the sampler with a fake clock."""
    from tests.measurement import test_gaps as gaps

    ok_all = True
    print("\n## gaps (sampler in-process, fake clock; P = 100 W + 50 W per busy core, CPU time from /proc/stat)")
    print("| case | truth (J) | measured (J) | estimated (J) | error | verdict |")
    print("|---|---|---|---|---|---|")
    for gap in (1, 10, 30, 60):
        with tempfile.TemporaryDirectory(prefix="joulesched-gaps-") as tmp:
            roots = Roots(sysfs=f"{tmp}/sys", procfs=f"{tmp}/proc", cgroup=f"{tmp}/cgroup", dev=f"{tmp}/dev")
            rig = gaps.bmc_rig(roots, FakeClock(), ProcTree(Path(roots.procfs), cpus=8))
            truth0, measured0, _ = gaps.learn_then_measure_from_now(rig)
            for _ in range(10):
                rig.second(2.0)
            for i in range(gap):
                rig.second(2.0 if i < gap // 2 else 8.0, readable=False)
            for _ in range(40):
                rig.second(3.0)
            measured, estimated = rig.exported("platform")
            truth, got = rig.truth - truth0, measured - measured0 + estimated
            error = (got - truth) / truth
            # up to max_gap_seconds (2.5 s) readings are integrated: off by at most the step × the spacing
            ok = abs(got - truth) <= 300.0 * 2.5 if gap <= 1 else abs(error) <= 0.02
            ok_all &= ok
            print(f"| BMC silent {gap} s, 200 → 500 W inside | {truth:.0f} | {measured - measured0:.0f} "
                  f"| {estimated:.0f} | {100 * error:+.2f} % | {'ok' if ok else 'FAIL'} |")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="joulesched-gaps-") as tmp:
        roots = Roots(sysfs=f"{tmp}/sys", procfs=f"{tmp}/proc", cgroup=f"{tmp}/cgroup", dev=f"{tmp}/dev")
        tree = PowercapTree(Path(roots.sysfs))
        rig = gaps.rapl_rig(roots, FakeClock(), ProcTree(Path(roots.procfs), cpus=8), tree)
        gaps.learn_then_measure_from_now(rig)
        truth0, (measured0, _) = rig.truth, rig.exported("package-0")
        for i in range(30):
            (tree.base / gaps.ENTRY / "energy_uj").unlink(missing_ok=True)
            rig.second(1.0 if i < 15 else 5.0, readable=False)
        tree.set(gaps.ENTRY, 0)
        for _ in range(40):
            rig.second(2.0)
        measured, estimated = rig.exported("package-0")
        truth, got = rig.truth - truth0, measured - measured0 + estimated
        error = (got - truth) / truth
        ok = abs(error) <= 0.02
        ok_all &= ok
        print(f"| RAPL gone 30 s, back reset, 150 → 350 W inside | {truth:.0f} | {measured - measured0:.0f} "
              f"| {estimated:.0f} | {100 * error:+.2f} % | {'ok' if ok else 'FAIL'} |")  # fmt: skip
    return ok_all


def probe(agent: Agent, seconds: float) -> dict[str, list[float]]:
    """Every 0.2 s for ``seconds``: each GET endpoint, and a window opened and closed; latencies."""
    latencies: dict[str, list[float]] = {}
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for path in ("/healthz", "/readyz", "/metrics"):
            latencies.setdefault(path, []).append(agent.get(path)[2])
        started = time.monotonic()
        _, doc = agent.request("POST", "/v1/windows")
        latencies.setdefault("POST /v1/windows", []).append(time.monotonic() - started)
        started = time.monotonic()
        agent.request("DELETE", f"/v1/windows/{doc['id']}")
        latencies.setdefault("DELETE /v1/windows/{id}", []).append(time.monotonic() - started)
        time.sleep(0.2)
    return latencies


def latency_table(baseline: dict[str, list[float]], faulty: dict[str, list[float]], fault: str) -> float:
    """Print median and slowest answers without and with the fault; return the worst added delay."""
    print(f"| endpoint | median, BMC answering | slowest, BMC answering | median, {fault} | slowest, {fault} |")
    print("|---|---|---|---|---|")
    added = 0.0
    for path, seconds in faulty.items():
        base = baseline[path]
        print(f"| {path} | {statistics.median(base) * 1000:.0f} ms | {max(base) * 1000:.0f} ms "
              f"| {statistics.median(seconds) * 1000:.0f} ms | {max(seconds) * 1000:.0f} ms |")  # fmt: skip
        added = max(added, max(seconds) - max(base), statistics.median(seconds) - statistics.median(base))
    return added


def seconds_until(condition: Callable[[], bool], limit: float = 60.0) -> float | None:
    """Poll ``condition`` every 0.25 s; the seconds it took to hold, None when it did not in ``limit``."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if condition():
            return time.monotonic() - started
        time.sleep(0.25)
    return None


def _metric(text: str, name: str, source: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'source="{source}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def silent_bmc(base: Path) -> bool:
    """A Redfish BMC next to RAPL that takes requests and never answers for 10 s."""
    from tests.measurement.sources.redfish_support import REDFISH_FIXTURES, MockupServer

    print("\n## a silent BMC (real agent: rapl_sysfs + redfish, timeout_s 5; the BMC silent for 10 s)")
    record = base / "record.jsonl"
    with MockupServer(REDFISH_FIXTURES / "hpe-proliant-dl360-gen11-ilo6") as bmc:
        sources = f'{{order: [rapl_sysfs, redfish], options: {{redfish: {{url: "{bmc.url}", timeout_s: 5}}}}}}'
        agent = Agent(base, sources, record)
        stop = threading.Event()

        def draw() -> None:  # 100 W on the package
            while not stop.wait(0.1):
                agent.powercap.advance("intel-rapl:0", 10.0)

        threading.Thread(target=draw, daemon=True).start()
        try:
            baseline = probe(agent, 10)
            silent_from = time.time()
            bmc.silent.set()
            latencies = probe(agent, 10)
            silent_to = time.time()
            up_during = _metric(agent.get("/metrics")[1], "joulesched_source_up", "redfish")
            bmc.silent.clear()
            back = seconds_until(lambda: _metric(agent.get("/metrics")[1], "joulesched_source_up", "redfish") == 1.0)
        finally:
            stop.set()
            agent.stop()
    samples = [json.loads(line) for line in record.read_text().splitlines() if '"type":"sample"' in line]
    during = [s for s in samples if silent_from <= s["t"] <= silent_to + 1]
    periods = [b["t"] - a["t"] for a, b in itertools.pairwise(during)]
    rapl_every = all(s["zones"].get("rapl_sysfs/package-0", 0.0) > 0 for s in during)
    added = latency_table(baseline, latencies, "BMC silent")
    ok = added < 0.1 and max(periods) - 1.0 < 0.1 and rapl_every and up_during == 0.0 and back is not None
    recovered = "never" if back is None else f"{back:.1f} s"
    print(f"\n{len(during)} samples while silent: periods {min(periods):.3f}–{max(periods):.3f} s (interval 1 s); "
          f"RAPL energy in every one: {rapl_every}; redfish source_up during: {up_during}; "
          f"source_up 1 again {recovered} after the BMC answered; worst delay added by the silence "
          f"{added * 1000:.0f} ms: {'ok' if ok else 'FAIL'}")  # fmt: skip
    return ok


def wrong_password_at_start(base: Path) -> bool:
    """Redfish with a wrong password when the agent starts; the password file fixed 5 s later."""
    from tests.measurement.sources.redfish_support import REDFISH_FIXTURES, MockupServer

    print("\n## wrong password at start, fixed 5 s later (real agent: redfish only)")
    password = base / "bmc-password"
    password.write_text("wrong\n")
    with MockupServer(REDFISH_FIXTURES / "hpe-proliant-dl360-gen11-ilo6", credentials=("monitor", "right")) as bmc:
        options = f'{{url: "{bmc.url}", username: monitor, password_file: "{password}"}}'
        agent = Agent(base, f"{{order: [redfish], options: {{redfish: {options}}}}}")
        try:
            ready0 = agent.get("/readyz")
            metrics0 = agent.get("/metrics")[1]
            time.sleep(5)
            password.write_text("right\n")
            back = seconds_until(lambda: agent.get("/readyz")[0] == 200)
            time.sleep(1.5)
            metrics1 = agent.get("/metrics")[1]
        finally:
            agent.stop()
    up0 = _metric(metrics0, "joulesched_source_up", "redfish")
    up1 = _metric(metrics1, "joulesched_source_up", "redfish")
    named = "joulesched_source_error_info{" in metrics0 and "401" in metrics0
    ok = ready0[0] == 503 and up0 == 0.0 and named and back is not None and up1 == 1.0
    recovered = "never" if back is None else f"{back:.1f} s"
    print(
        f"at start: /readyz {ready0[0]}, source_up {up0}, error exported: {named}; ready {recovered} after the fix, "
        f"source_up {up1}: {'ok' if ok else 'FAIL'}\n/readyz said: {ready0[1].strip()[:300]}"
    )
    return ok


def bmc_killed_and_restarted(base: Path) -> bool:
    """FreeIPMI reading a lanplus BMC (the simulated one of the tests) that is killed for 15 s and
    restarted on its port, at a constant 231 W, next to RAPL."""
    from tests.measurement.sources.ipmi_support import BMC_SIM, DELL_LIKE_SENSORS, PASSWORD, USER

    print("\n## a BMC killed for 15 s and restarted (real agent: rapl_sysfs + ipmi_dcmi through FreeIPMI, 231 W)")
    state = base / "bmc-state.json"
    dcmi = {"mode": "active", "current": 231, "minimum": 180, "maximum": 402, "average": 231, "period_ms": 1000}
    state.write_text(json.dumps({"users": {USER: PASSWORD}, "dcmi": dcmi, "sensors": DELL_LIKE_SENSORS}))
    password = base / "bmc-password"
    password.write_text(PASSWORD + "\n")

    def start_bmc(port: int = 0) -> tuple[subprocess.Popen[str], int]:
        proc = subprocess.Popen(
            [sys.executable, str(BMC_SIM), str(state), str(port)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        return proc, int(proc.stdout.readline().split()[1])

    bmc, port = start_bmc()
    options = (f'{{host: 127.0.0.1, port: {port}, username: {USER}, password_file: "{password}", tool: freeipmi, '
               "timeout_s: 6}")  # fmt: skip
    record = base / "record.jsonl"
    agent = Agent(base, f"{{order: [rapl_sysfs, ipmi_dcmi], options: {{ipmi_dcmi: {options}}}}}", record,
                  extra="model: {min_samples: 10}\n")  # fmt: skip
    try:
        baseline = probe(agent, 15)  # meanwhile the zone's model learns (10 clean intervals)
        killed = time.time()
        bmc.kill()
        bmc.wait()
        latencies = probe(agent, 15)
        bmc, _ = start_bmc(port)
        restarted = time.time()
        back = seconds_until(lambda: _metric(agent.get("/metrics")[1], "joulesched_source_up", "ipmi_dcmi") == 1.0)
        time.sleep(5)
        metrics = agent.get("/metrics")[1]
    finally:
        agent.stop()
        bmc.kill()
        bmc.wait()
    samples = [json.loads(line) for line in record.read_text().splitlines() if '"type":"sample"' in line]
    watts = [s["zones"].get("ipmi_dcmi/platform", 0.0) / s["dt"] if s.get("dt") else 0.0 for s in samples]

    def aligned(i: int) -> bool:  # no reading of this or the last interval still to come (one late by the wait)
        return i > 0 and 200 < watts[i] < 260 and 200 < watts[i - 1] < 260

    before = max(i for i, s in enumerate(samples) if s["t"] <= killed and aligned(i))
    end = max(i for i in range(len(samples)) if aligned(i))
    span = samples[end]["t"] - samples[before]["t"]
    got = sum(s["zones"].get("ipmi_dcmi/platform", 0.0) for s in samples[before + 1 : end + 1])
    truth = 231.0 * span
    estimated = _metric(metrics, "joulesched_node_energy_estimated_joules_total", "ipmi_dcmi") or 0.0
    during = [s for s in samples if killed <= s["t"] <= restarted]
    periods = [b["t"] - a["t"] for a, b in itertools.pairwise(during)]
    error = (got - truth) / truth
    added = latency_table(baseline, latencies, "BMC down")
    ok = abs(error) <= 0.02 and estimated > 0 and back is not None and added < 0.1 and max(periods) - 1.0 < 0.1
    recovered = "never" if back is None else f"{back:.1f} s"
    print(f"\nsample periods while down {min(periods):.3f}–{max(periods):.3f} s; ipmi_dcmi up again {recovered} after "
          f"the restart; across the outage ({span:.1f} s): truth {truth:.0f} J, exported {got:.0f} J "
          f"({estimated:.0f} J of it estimated), {100 * error:+.2f} %; worst delay added by the outage "
          f"{added * 1000:.0f} ms: {'ok' if ok else 'FAIL'}")  # fmt: skip
    return ok


def main() -> int:
    logging.basicConfig(level=logging.ERROR)  # the meter's one-off anomaly warnings are the point here
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}\n")
    ok = counter_cases()
    ok &= gap_cases()
    with tempfile.TemporaryDirectory(prefix="joulesched-faults-") as tmp:
        ok &= silent_bmc(Path(tmp))
    with tempfile.TemporaryDirectory(prefix="joulesched-faults-") as tmp:
        ok &= wrong_password_at_start(Path(tmp))
    with tempfile.TemporaryDirectory(prefix="joulesched-faults-") as tmp:
        ok &= bmc_killed_and_restarted(Path(tmp))
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
