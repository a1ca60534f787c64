"""Provider mode through the agent itself: the ``nadiki`` section of the agent's configuration
registers the server and pushes the agent's own counters (docs/provider.md)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from joulesched.measurement.agent import build_agent
from joulesched.measurement.config import AgentConfig, KubernetesConfig, SourcesConfig, load_config, parse_agent_config
from joulesched.measurement.nadiki import parse_provider_config
from joulesched.measurement.sources.base import Roots
from joulesched.policy.errors import ConfigError
from tests.measurement.fakes import FakeClock
from tests.measurement.nadiki.nadiki_support import RegistrarServer, needs_spec
from tests.measurement.replica import PowercapTree, ProcTree

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_the_shipped_provider_config_is_a_valid_agent_config() -> None:
    config = load_config(str(DEPLOY / "provider" / "provider.yaml"))
    assert config.nadiki is not None
    assert config.nadiki.server.facility_id == "FACILITY-NLD-001"
    assert config.kubernetes.mode == "off"


def test_problems_in_the_nadiki_section_are_reported_with_the_others() -> None:
    with pytest.raises(ConfigError) as err:
        parse_agent_config({"interval_seconds": 0, "nadiki": {"registrar_url": "ftp://x", "server": {}}}, "a.yaml")
    text = str(err.value)
    assert "interval_seconds" in text
    assert "nadiki.registrar_url: must be an http:// or https:// URL" in text
    assert "nadiki.server.facility_id" in text


@needs_spec  # the local registrar checks every request body against the spec's schemas
def test_the_agent_registers_and_pushes_its_rapl_counters(tmp_path: Path) -> None:
    roots = Roots(sysfs=str(tmp_path / "sys"), procfs=str(tmp_path / "proc"), cgroup=str(tmp_path / "cg"))
    powercap = PowercapTree(Path(roots.sysfs))
    powercap.add("intel-rapl:0", "package-0")
    powercap.add("intel-rapl:0:0", "core")  # a sub-zone: never counted on top of its package
    powercap.add("intel-rapl:0:1", "dram")
    ProcTree(Path(roots.procfs), cpus=4)
    clock = FakeClock(1_767_268_801.0)
    with RegistrarServer() as registrar:
        nadiki = parse_provider_config(
            {
                "registrar_url": registrar.registrar_url,
                "state_file": str(tmp_path / "server.json"),
                "server": {"facility_id": "FACILITY-NLD-001", "rack_id": "RACK-001"},
            }
        )
        config = replace(
            AgentConfig(),
            roots=roots,
            sources=SourcesConfig(order=("rapl_sysfs",)),
            kubernetes=KubernetesConfig(mode="off"),
            nadiki=nadiki,
        )
        agent = build_agent(config, clock=clock)
        agent.step()
        for _ in range(70):  # 70 s: one whole 30 s window [..830, ..860) and the settling after it
            clock.tick(1.0)
            powercap.advance("intel-rapl:0", 120.0)
            powercap.advance("intel-rapl:0:0", 90.0)
            powercap.advance("intel-rapl:0:1", 20.0)
            agent.step()
        pusher = threading.Thread(target=agent._provide, daemon=True)
        pusher.start()
        deadline = time.monotonic() + 10
        while not registrar.state.lines and time.monotonic() < deadline:
            time.sleep(0.05)
        agent.stop()
        pusher.join(timeout=5)
        assert registrar.state.line_errors == []
        lines = sorted((p.timestamp, *p.fields.items()) for p in registrar.state.lines)
        # package + DRAM = 140 W over each whole 30 s window; the core sub-zone is inside the package
        assert lines[0] == (1_767_268_830, ("cpu_energy_consumption_joules", pytest.approx(4200.0)))
        assert {p.tags["server_id"] for p in registrar.state.lines} == set(registrar.state.servers)
        assert (tmp_path / "server.json").exists()
