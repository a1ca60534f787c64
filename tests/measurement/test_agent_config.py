"""Agent configuration: defaults, then file, then flags; every problem reported with its path."""

from __future__ import annotations

from pathlib import Path

import pytest

from joulesched.measurement.config import (
    AgentConfig,
    ModelConfig,
    is_loopback,
    load_config,
    parse_agent_config,
    parse_listen,
)
from joulesched.policy.errors import ConfigError


def test_defaults_are_valid() -> None:
    config = AgentConfig()
    assert config.validate() == []
    assert config.interval_seconds == 1.0
    assert config.attribution.idle_policy == "requests"
    assert "rapl_msr" not in config.sources.order  # opt-in
    assert parse_agent_config({}) == config


def test_file_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "interval_seconds: 2\n"
        "server: {listen: '0.0.0.0:9102', token_file: /etc/joulesched/token}\n"
        "roots: {sysfs: /host/sys}\n"
        "attribution: {idle_policy: bucket}\n"
        "sources: {order: [rapl_msr, ipmi_dcmi], server_includes_gpus: true, options: {ipmi_dcmi: {host: bmc1}}}\n"
    )
    config = load_config(str(path), {"interval_seconds": 0.5, "roots": {"procfs": "/host/proc"}})
    assert config.interval_seconds == 0.5  # the flag wins
    assert (
        config.roots.sysfs == "/host/sys"
        and config.roots.procfs == "/host/proc"
        and config.roots.cgroup == "/sys/fs/cgroup"
    )
    assert config.server.listen == "0.0.0.0:9102"
    assert config.attribution.idle_policy == "bucket"
    assert config.sources.order == ("rapl_msr", "ipmi_dcmi")
    assert config.sources.server_includes_gpus is True
    assert config.sources.options == {"ipmi_dcmi": {"host": "bmc1"}}


def test_every_problem_is_reported_at_once_with_its_path() -> None:
    doc = {
        "interval_seconds": 0.01,
        "attribution": {"idle_policy": "even", "pod_retention_seconds": "300"},
        "sources": {"order": ["rapl_sysfs", "tapeworm"]},
        "server": {"listen": "nowhere"},
        "model": {"min_samples": 1.5},
        "colour": "blue",
    }
    with pytest.raises(ConfigError) as err:
        parse_agent_config(doc, "agent.yaml")
    problems = "\n".join(err.value.problems)
    assert "colour: unknown field" in problems
    assert "attribution.pod_retention_seconds: must be a number, got string '300'" in problems  # no numbers as strings
    assert "model.min_samples: must be a whole number" in problems
    assert str(err.value).startswith("agent.yaml: ")
    problems = err.value.problems
    assert "interval_seconds: must be between 0.1 and 60, got 0.01" in problems
    assert "attribution.idle_policy: must be one of requests, bucket, got 'even'" in problems
    assert any(p.startswith("sources.order: unknown source 'tapeworm'") for p in problems)
    assert any(p.startswith("server.listen: must be HOST:PORT") for p in problems)


def test_validate_works_on_configs_built_in_code() -> None:
    config = AgentConfig(interval_seconds=0.05, model=ModelConfig(window_samples=1, min_samples=5))
    problems = config.validate()
    assert any(p.startswith("interval_seconds:") for p in problems)
    assert any(p.startswith("model.window_samples:") for p in problems)
    assert any(p.startswith("model.min_samples:") for p in problems)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("interval_seconds: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(str(listy))


@pytest.mark.parametrize(
    ("listen", "host", "port", "loopback"),
    [
        ("127.0.0.1:9102", "127.0.0.1", 9102, True),
        (":9102", "0.0.0.0", 9102, False),
        ("[::1]:80", "::1", 80, True),
        ("localhost:1", "localhost", 1, True),
        ("10.0.0.5:9102", "10.0.0.5", 9102, False),
    ],
    ids=["loopback v4", "all interfaces", "loopback v6", "localhost", "a node address"],
)
def test_listen_addresses(listen: str, host: str, port: int, loopback: bool) -> None:
    assert parse_listen(listen) == (host, port)
    assert is_loopback(host) is loopback


def test_a_bare_off_in_yaml_gets_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("kubernetes: {mode: off}\n")
    with pytest.raises(
        ConfigError, match=r'kubernetes.mode: YAML read the bare word off as false: quote it \(mode: "off"\)'
    ):
        load_config(str(path))
