"""Extender configuration: defaults in code, then the YAML file, then command-line flags.

::

    listen: 0.0.0.0:8888
    prefix: /scheduler             # verbs live at {prefix}/filter, {prefix}/prioritize, ...
    max_request_bytes: 33554432    # larger bodies get HTTP 413
    profiles:
      source: file                 # file | prometheus
      file:
        path: /etc/joulesched/nodes.yaml   # absent: the shipped example cluster
        reload_seconds: 10
      prometheus:
        url: http://prometheus.monitoring:9090
        cache_seconds: 10
        timeout_seconds: 2
    policy: {strategy: carbon, band: 0.5, ...}          # see policy/config.py
    predicted_load:
      ttl_seconds: 300             # forget a placement after this long at the latest
      settle_seconds: 30           # a measurement this long after a placement shows the pod
      watch_pods: false            # watch pod bindings through the Kubernetes API
    bind:
      enabled: false               # serve the bind verb (binds through the Kubernetes API)
    servers:                       # virtualised clusters: profiles are per physical server
      label: joulesched.io/server-id   # the node label naming a node's physical server
      watch_nodes: false           # watch nodes for that label (NodeNames mode needs it)
    kubeconfig: ""                 # empty: in-cluster config
    server: {workers: 2, threads: 4, timeout_seconds: 30, keepalive_seconds: 75}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from joulesched.contracts.documents import read_yaml
from joulesched.policy.config import PolicyConfig, parse_policy
from joulesched.policy.validate import Checker

EXAMPLE_PROFILES = "example-nodes.yaml"  # shipped in extender/data/


def example_profiles_path() -> str:
    return str(Path(__file__).with_name("data") / EXAMPLE_PROFILES)


@dataclass(frozen=True)
class ServerConfig:
    workers: int = 2
    threads: int = 4
    timeout_seconds: float = 30.0
    keepalive_seconds: float = 120.0


@dataclass(frozen=True)
class ExtenderConfig:
    listen: str = "0.0.0.0:8888"
    prefix: str = "/scheduler"
    max_request_bytes: int = 32 * 1024 * 1024
    source: str = "file"
    file_path: str = field(default_factory=example_profiles_path)
    file_reload_seconds: float = 10.0
    prometheus_url: str = ""
    prometheus_cache_seconds: float = 10.0
    prometheus_timeout_seconds: float = 2.0
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    predicted_ttl_seconds: float = 300.0
    predicted_settle_seconds: float = 30.0
    watch_pods: bool = False
    bind_enabled: bool = False
    server_id_label: str = "joulesched.io/server-id"
    watch_nodes: bool = False
    kubeconfig: str = ""
    server: ServerConfig = field(default_factory=ServerConfig)

    def with_listen(self, listen: str | None) -> ExtenderConfig:
        if listen is None:
            return self
        check = Checker("--listen")
        _check_listen(listen, "listen", check)
        check.raise_if_any()
        return replace(self, listen=listen)


TOP_FIELDS = (
    "listen",
    "prefix",
    "max_request_bytes",
    "profiles",
    "policy",
    "predicted_load",
    "bind",
    "servers",
    "kubeconfig",
    "server",
)


def _check_listen(value: str, path: str, check: Checker) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        check.problem(path, f"must be HOST:PORT with a port in 1..65535, got {value!r}")


def parse_config(doc: Any, where: str, base_dir: Path | None = None) -> ExtenderConfig:
    """Validate an extender config mapping; ``ConfigError`` lists every problem at once."""
    check = Checker(where)
    root = check.mapping(doc, "")
    check.unknown_keys(root, TOP_FIELDS, "")
    d = ExtenderConfig()
    listen = check.string(root, "listen", "", default=d.listen) or d.listen
    _check_listen(listen, "listen", check)
    prefix = check.string(root, "prefix", "", default=d.prefix) or d.prefix
    if not prefix.startswith("/") or (prefix.endswith("/") and prefix != "/"):
        check.problem("prefix", f"must start with '/' and not end with '/', got {prefix!r}")
    max_bytes = check.number(root, "max_request_bytes", "", default=float(d.max_request_bytes), minimum=1024)

    profiles = check.mapping(root.get("profiles"), "profiles")
    check.unknown_keys(profiles, ("source", "file", "prometheus"), "profiles")
    source = check.string(profiles, "source", "profiles", default=d.source, choices=("file", "prometheus")) or d.source
    file_doc = check.mapping(profiles.get("file"), "profiles.file")
    check.unknown_keys(file_doc, ("path", "reload_seconds"), "profiles.file")
    file_path = check.string(file_doc, "path", "profiles.file", default="") or d.file_path
    if base_dir is not None and not Path(file_path).is_absolute():
        file_path = str(base_dir / file_path)
    reload_s = check.number(file_doc, "reload_seconds", "profiles.file", default=d.file_reload_seconds, exclusive_minimum=0)
    prom = check.mapping(profiles.get("prometheus"), "profiles.prometheus")
    check.unknown_keys(prom, ("url", "cache_seconds", "timeout_seconds"), "profiles.prometheus")
    prom_url = check.string(prom, "url", "profiles.prometheus", default="") or ""
    if source == "prometheus" and not prom_url:
        check.problem("profiles.prometheus.url", "is required when profiles.source is prometheus")
    if prom_url and not prom_url.startswith(("http://", "https://")):
        check.problem("profiles.prometheus.url", f"must be an http:// or https:// URL, got {prom_url!r}")
    cache_s = check.number(prom, "cache_seconds", "profiles.prometheus", default=d.prometheus_cache_seconds, minimum=0)
    timeout_s = check.number(
        prom, "timeout_seconds", "profiles.prometheus", default=d.prometheus_timeout_seconds, exclusive_minimum=0
    )

    policy = parse_policy(root.get("policy"), check, "policy")

    pred = check.mapping(root.get("predicted_load"), "predicted_load")
    check.unknown_keys(pred, ("ttl_seconds", "settle_seconds", "watch_pods"), "predicted_load")
    ttl = check.number(pred, "ttl_seconds", "predicted_load", default=d.predicted_ttl_seconds, minimum=0)
    settle = check.number(pred, "settle_seconds", "predicted_load", default=d.predicted_settle_seconds, minimum=0)
    watch = check.boolean(pred, "watch_pods", "predicted_load", default=d.watch_pods)

    bind = check.mapping(root.get("bind"), "bind")
    check.unknown_keys(bind, ("enabled",), "bind")
    bind_enabled = check.boolean(bind, "enabled", "bind", default=d.bind_enabled)
    kubeconfig = check.string(root, "kubeconfig", "", default="") or ""
    servers = check.mapping(root.get("servers"), "servers")
    check.unknown_keys(servers, ("label", "watch_nodes"), "servers")
    server_label = check.string(servers, "label", "servers", default=d.server_id_label) or d.server_id_label
    watch_nodes = check.boolean(servers, "watch_nodes", "servers", default=d.watch_nodes)

    srv = check.mapping(root.get("server"), "server")
    check.unknown_keys(srv, ("workers", "threads", "timeout_seconds", "keepalive_seconds"), "server")
    ds = ServerConfig()
    workers = check.number(srv, "workers", "server", default=float(ds.workers), minimum=1, maximum=64)
    threads = check.number(srv, "threads", "server", default=float(ds.threads), minimum=1, maximum=256)
    for key, value in (("workers", workers), ("threads", threads)):
        if value is not None and value != int(value):
            check.problem(f"server.{key}", f"must be a whole number, got {value:g}")
    srv_timeout = check.number(srv, "timeout_seconds", "server", default=ds.timeout_seconds, exclusive_minimum=0)
    keepalive = check.number(srv, "keepalive_seconds", "server", default=ds.keepalive_seconds, exclusive_minimum=0)
    check.raise_if_any()
    return ExtenderConfig(
        listen=listen,
        prefix=prefix,
        max_request_bytes=int(max_bytes or d.max_request_bytes),
        source=source,
        file_path=file_path,
        file_reload_seconds=reload_s or d.file_reload_seconds,
        prometheus_url=prom_url,
        prometheus_cache_seconds=cache_s if cache_s is not None else d.prometheus_cache_seconds,
        prometheus_timeout_seconds=timeout_s or d.prometheus_timeout_seconds,
        policy=policy,
        predicted_ttl_seconds=ttl if ttl is not None else d.predicted_ttl_seconds,
        predicted_settle_seconds=settle if settle is not None else d.predicted_settle_seconds,
        watch_pods=watch,
        bind_enabled=bind_enabled,
        server_id_label=server_label,
        watch_nodes=watch_nodes,
        kubeconfig=kubeconfig,
        server=ServerConfig(int(workers or ds.workers), int(threads or ds.threads), srv_timeout or ds.timeout_seconds, keepalive or ds.keepalive_seconds),
    )


def load_config(path: str | None) -> ExtenderConfig:
    """Read the config file (``None``: the defaults, serving the shipped example cluster)."""
    if path is None:
        return ExtenderConfig()
    file = Path(path)
    doc = read_yaml(file)
    return parse_config(doc, str(file), base_dir=file.parent)


def mapping_or_empty(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
