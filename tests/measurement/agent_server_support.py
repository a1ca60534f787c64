"""A running agent on a replica node, for the HTTP API tests (``running``/``with_token`` in conftest)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from joulesched.measurement.agent import Agent, build_agent, build_server
from joulesched.measurement.config import AgentConfig, KubernetesConfig, ModelConfig, ServerConfig, SourcesConfig
from joulesched.measurement.server import AgentServer
from joulesched.measurement.sources.base import Roots
from tests.measurement.fakes import FakeClock
from tests.measurement.replica import CgroupTree, PowercapTree, ProcTree

POD = "aaaaaaaa-0000-4000-8000-000000000001"


@dataclass
class Running:
    agent: Agent
    server: AgentServer
    url: str
    clock: FakeClock
    powercap: PowercapTree
    proc: ProcTree
    cgroup: CgroupTree
    busy: float = 0.0

    def step(self, seconds: float = 1.0, busy_cores: float = 1.0, package_w: float = 100.0) -> None:
        self.clock.tick(seconds)
        self.powercap.advance("intel-rapl:0", (package_w + 10 * busy_cores) * seconds)
        self.powercap.advance("intel-rapl:0:1", 5.0 * seconds)
        self.busy += busy_cores * seconds
        self.cgroup.set_cpu(POD, self.busy * 0.5)
        self.proc.set_stat(self.busy, 100.0)
        self.agent.step()

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None, token: str | None = None
    ) -> tuple[int, Any, dict[str, str]]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                raw, status, headers = response.read(), response.status, dict(response.headers)
        except urllib.error.HTTPError as err:
            with err:
                raw, status, headers = err.read(), err.code, dict(err.headers)
        kind = headers.get("Content-Type", "")
        return status, json.loads(raw) if "json" in kind else raw.decode(), headers


def start(tmp_path: Path, clock: FakeClock, token: str | None = None, interval: float = 1.0) -> Running:
    roots = Roots(
        sysfs=str(tmp_path / "sys"),
        procfs=str(tmp_path / "proc"),
        cgroup=str(tmp_path / "cgroup"),
        dev=str(tmp_path / "dev"),
    )
    powercap = PowercapTree(Path(roots.sysfs))
    powercap.add("intel-rapl:0", "package-0")
    powercap.add("intel-rapl:0:1", "dram")
    proc = ProcTree(Path(roots.procfs), cpus=4)
    cgroup = CgroupTree(Path(roots.cgroup))
    cgroup.add_pod(POD, "burstable", 0.0, 1000)
    token_file = ""
    if token:
        (tmp_path / "token").write_text(token + "\n")
        token_file = str(tmp_path / "token")
    config = AgentConfig(
        node=AgentConfig().node.__class__(name="node-a"),
        interval_seconds=interval,
        roots=roots,
        sources=SourcesConfig(order=("rapl_sysfs",)),
        model=ModelConfig(window_samples=50, min_samples=4, min_spread_cores=0.5),
        kubernetes=KubernetesConfig(mode="off"),
        server=ServerConfig(listen="127.0.0.1:0", token_file=token_file),
    )
    agent = build_agent(config, clock=clock)
    server = build_server(agent)
    server.serve_in_thread()
    host, port = server.server_address[:2]
    return Running(agent, server, f"http://{host}:{port}", clock, powercap, proc, cgroup)
