"""The site and server factors the agent exports from its site file (``sites.file``), which the
recording rules and ``joulesched report`` join through ``joulesched_node_info``."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from joulesched.measurement.agent import build_agent
from joulesched.measurement.config import AgentConfig, KubernetesConfig, NodeConfig, SourcesConfig, parse_agent_config
from joulesched.measurement.exporters.prometheus import make_registry
from joulesched.measurement.sources.base import Roots
from joulesched.policy.errors import ConfigError
from tests.measurement.fakes import FakeClock
from tests.measurement.replica import PowercapTree, ProcTree

SITES = {
    "sites": {
        "north": {"pue": 1.2, "wue": 0.3, "renewable_share": 0.4, "carbon_intensity": 55},
        "south": {"pue": 1.5, "carbon_intensity": 441},
    },
    "servers": {"default": {"embodied_kg": 1300, "lifetime_years": 4}, "srv-7": {"embodied_kg": 2500, "lifetime_years": 5}},
}


def agent_config(tmp_path: Path, site: str, server_id: str, sites: object = SITES) -> AgentConfig:
    roots = Roots(sysfs=str(tmp_path / "sys"), procfs=str(tmp_path / "proc"), cgroup=str(tmp_path / "cg"))
    PowercapTree(Path(roots.sysfs)).add("intel-rapl:0", "package-0")
    ProcTree(Path(roots.procfs), cpus=4)
    (tmp_path / "sites.yaml").write_text(yaml.safe_dump(sites))
    return replace(
        AgentConfig(),
        node=NodeConfig(name="node-a", site=site, server_id=server_id),
        roots=roots,
        sources=SourcesConfig(order=("rapl_sysfs",)),
        kubernetes=KubernetesConfig(mode="off"),
        site_file=str(tmp_path / "sites.yaml"),
    )


def exposition(tmp_path: Path, site: str, server_id: str) -> str:
    agent = build_agent(agent_config(tmp_path, site, server_id), clock=FakeClock())
    agent.step()
    return generate_latest(make_registry(agent.latest_published, agent.site)).decode()


def test_the_nodes_site_and_server_are_exported(tmp_path: Path) -> None:
    text = exposition(tmp_path, "north", "srv-7")
    for line in [
        'joulesched_site_pue_ratio{site="north"} 1.2',
        'joulesched_site_grid_carbon_intensity_grams_per_kwh{site="north"} 55.0',
        'joulesched_site_wue_litres_per_kwh{site="north"} 0.3',
        'joulesched_site_renewable_share_ratio{site="north"} 0.4',
        'joulesched_server_embodied_emissions_grams{server_id="srv-7"} 2.5e+06',
        'joulesched_node_info{node="node-a",server_id="srv-7",site="north"} 1.0',
    ]:
        assert line in text
    assert 'site="south"' not in text  # only this node's site: one agent, one site
    lifetime = next(ln for ln in text.splitlines() if ln.startswith("joulesched_server_lifetime_seconds{"))
    assert float(lifetime.split()[-1]) == pytest.approx(5 * 8760 * 3600, rel=0.01)


def test_a_server_without_its_own_entry_takes_the_default(tmp_path: Path) -> None:
    text = exposition(tmp_path, "south", "")
    assert 'joulesched_server_embodied_emissions_grams{server_id=""} 1.3e+06' in text


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: apt install prometheus)")
def test_promtool_accepts_the_site_gauges(tmp_path: Path) -> None:
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=exposition(tmp_path, "north", "srv-7").encode(), capture_output=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_site_the_file_does_not_hold_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"node.site 'east' is not a site of this file \(north, south\)"):
        build_agent(agent_config(tmp_path, "east", ""), clock=FakeClock())


def test_a_malformed_site_file_names_the_field(tmp_path: Path) -> None:
    bad = {"sites": {"north": {"pue": 0.5}}}
    with pytest.raises(ConfigError, match=r"(?s)sites.yaml.*sites\.north\.pue: must be >= 1"):
        build_agent(agent_config(tmp_path, "north", "", sites=bad), clock=FakeClock())


def test_the_config_section() -> None:
    assert parse_agent_config({"sites": {"file": "/etc/joulesched/sites.yaml"}}).site_file == "/etc/joulesched/sites.yaml"
    with pytest.raises(ConfigError, match=r"sites\.path"):
        parse_agent_config({"sites": {"path": "x"}})


def test_a_live_carbon_api_exports_its_intensity_and_age(tmp_path: Path) -> None:
    from joulesched.contracts.carbon_apis import live_source
    from tests.contracts.api_server import ApiServer, Clock, Reply, fixture, inline

    server = ApiServer()
    try:
        down = {"now": False}
        server.routes[r"/intensity/2018-01-20T12:\d\dZ/fw48h"] = lambda req: (
            Reply(503, b"down for maintenance") if down["now"] else Reply(body=fixture("uk_national_fw48h.json"))
        )
        api = {"provider": "uk_carbon_intensity", "url": server.url, "history_hours": 0, "refresh_s": 600}
        sites = {"sites": {"north": {"pue": 1.2, "carbon_api": {**api, "max_age_s": 1800, "fallback": 300}}}}
        agent = build_agent(agent_config(tmp_path, "north", "", sites=sites), clock=FakeClock())
        assert agent.site is not None
        live = live_source(agent.site.catalogue.sites["north"].carbon)
        assert live is not None
        clock = Clock(1516449600.0 + 60)  # 2018-01-20T12:01Z, the fixture's time
        live.clock, live.spawn = clock, inline  # a due refresh finishes before the scrape returns
        agent.step()
        factors = replace(agent.site, clock=clock)  # the time the gauge asks about

        def scrape() -> str:
            return generate_latest(make_registry(agent.latest_published, factors)).decode()

        text = scrape()
        assert 'joulesched_site_grid_carbon_intensity_grams_per_kwh{site="north"} 266.0' in text
        assert 'joulesched_site_grid_carbon_intensity_age_seconds{site="north"} 0.0' in text
        down["now"] = True
        clock.advance(600)  # refresh due, fails: the last value with its age
        text = scrape()
        assert 'joulesched_site_grid_carbon_intensity_grams_per_kwh{site="north"} 266.0' in text
        assert 'joulesched_site_grid_carbon_intensity_age_seconds{site="north"} 600.0' in text
        clock.advance(1201)  # past max_age: the fallback, and the age says why
        text = scrape()
        assert 'joulesched_site_grid_carbon_intensity_grams_per_kwh{site="north"} 300.0' in text
        assert 'joulesched_site_grid_carbon_intensity_age_seconds{site="north"} 1801.0' in text
        if shutil.which("promtool"):
            check = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True)
            assert check.returncode == 0, check.stdout + check.stderr
    finally:
        server.close()
