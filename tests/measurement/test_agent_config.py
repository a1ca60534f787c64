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


# --- credentials and URLs (docs/agent.md, "Credentials and URLs") ------------------------------------

PROVIDER = "nadiki: {registrar_url: %s, %s server: {facility_id: F, rack_id: R}}\n"


def test_a_bmc_password_over_plain_http_is_refused_at_load_naming_the_file_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    redfish = "sources: {options: {redfish: {url: '%s', username: monitor, password_env: BMC_PASSWORD%s}}}\n"
    path.write_text(redfish % ("http://bmc.example", ""))
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert info.value.where == str(path)
    assert info.value.problems == [
        "sources.options.redfish.url: http:// would send the BMC password (password_env) in cleartext to"
        " bmc.example: use https://, or set allow_plain_http: true to accept that on a network you trust"
        " (loopback needs neither)"
    ]
    path.write_text(redfish % ("http://bmc.example", ", allow_plain_http: true"))
    assert load_config(str(path)).sources.options["redfish"]["allow_plain_http"] is True
    for url in ("https://bmc.example", "http://127.0.0.1:8000", "http://[::1]:8000", "http://localhost:8000"):
        path.write_text(redfish % (url, ""))
        load_config(str(path))


def test_a_registrar_token_over_plain_http_is_refused_at_load(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("REGISTRAR-TOKEN\n")
    path = tmp_path / "agent.yaml"
    path.write_text(PROVIDER % ("http://registry.example/v1", f"registrar_token_file: {token},"))
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert info.value.where == str(path)
    assert info.value.problems == [
        "nadiki.registrar_url: http:// would send the registrar token (registrar_token_file) in cleartext to"
        " registry.example: use https://, or set allow_plain_http: true to accept that on a network you trust"
        " (loopback needs neither)"
    ]
    path.write_text(PROVIDER % ("http://registry.example/v1", f"registrar_token_file: {token}, allow_plain_http: true,"))
    config = load_config(str(path)).nadiki
    assert config is not None and config.allow_plain_http
    for url, more in (
        ("http://registry.example/v1", ""),  # no token: nothing secret crosses the network
        ("http://127.0.0.1:8080/v1", f"registrar_token_file: {token},"),
        ("https://registry.example/v1", f"registrar_token_file: {token},"),
    ):
        path.write_text(PROVIDER % (url, more))
        load_config(str(path))


@pytest.mark.parametrize(
    ("document", "key", "use"),
    [
        (
            "sources: {options: {redfish: {url: 'https://monitor:BMC-PASSWORD@bmc.example'}}}\n",
            "sources.options.redfish.url",
            "password_file or password_env",
        ),
        (PROVIDER % ("'https://agent:BMC-PASSWORD@registry.example/v1'", ""), "nadiki.registrar_url", "registrar_token_file"),
        (PROVIDER % ("'https://BMC-PASSWORD@registry.example/v1'", ""), "nadiki.registrar_url", "registrar_token_file"),
    ],
    ids=["redfish url", "registrar url", "a token as the user"],
)
def test_credentials_in_a_url_are_refused_at_load_and_never_repeated(
    tmp_path: Path, document: str, key: str, use: str
) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(document)
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert info.value.where == str(path)
    assert info.value.problems == [
        f"{key}: must not carry credentials (user:password@ in the URL ends up in logs, errors and /metrics):"
        f" remove them and use {use}"
    ]
    assert "BMC-PASSWORD" not in str(info.value)
