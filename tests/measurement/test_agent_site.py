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
from prometheus_client.parser import text_string_to_metric_families

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
    # without node.server_id the server is the node's: labelled by the node name it was looked up by
    assert 'joulesched_server_embodied_emissions_grams{server_id="node-a"} 1.3e+06' in text
    assert 'joulesched_node_info{node="node-a",server_id="node-a",site="south"} 1.0' in text


def test_each_node_without_a_server_id_joins_to_its_own_servers_figures(tmp_path: Path) -> None:
    """``servers`` is keyed by server id or node name: a node whose name has an entry and one that
    takes the default are told apart by the rules' join (max by (server_id) ... on (server_id)
    joulesched_node_info)."""
    sites = {**SITES, "servers": {**SITES["servers"], "node-big": {"embodied_kg": 9000, "lifetime_years": 4}}}  # type: ignore[dict-item]
    samples = []
    for node in ("node-big", "node-small"):
        (tmp_path / node).mkdir()
        cfg = replace(agent_config(tmp_path / node, "north", "", sites), node=NodeConfig(name=node, site="north"))
        agent = build_agent(cfg, clock=FakeClock())
        agent.step()
        text = generate_latest(make_registry(agent.latest_published, agent.site)).decode()
        samples += [s for f in text_string_to_metric_families(text) for s in f.samples]
    server_of = {s.labels["node"]: s.labels["server_id"] for s in samples if s.name == "joulesched_node_info"}
    embodied: dict[str, float] = {}
    for s in samples:
        if s.name == "joulesched_server_embodied_emissions_grams":
            embodied[s.labels["server_id"]] = max(embodied.get(s.labels["server_id"], 0.0), s.value)
    assert server_of == {"node-big": "node-big", "node-small": "node-small"}
    assert {node: embodied[server] for node, server in server_of.items()} == {"node-big": 9.0e6, "node-small": 1.3e6}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: apt install prometheus)")
def test_a_site_without_carbon_data_exports_no_intensity_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Not 0 g/kWh, which the extender would score as the cleanest site: no gauge, as for a
    # source that cannot answer; the other factors as given.
    sites = {"sites": {"lab": {"pue": 1.3}}}
    with caplog.at_level("INFO"):
        agent = build_agent(agent_config(tmp_path, "lab", "", sites), clock=FakeClock())
    assert "site lab: no carbon intensity given" in caplog.text  # once, at start
    caplog.clear()
    agent.step()
    with caplog.at_level("INFO"):
        texts = [generate_latest(make_registry(agent.latest_published, agent.site)).decode() for _ in range(3)]
    assert 'joulesched_site_pue_ratio{site="lab"} 1.3' in texts[0]
    assert all("joulesched_site_grid_carbon_intensity_grams_per_kwh{" not in t for t in texts)
    assert "carbon intensity unavailable" not in caplog.text  # not a warning at every scrape


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
