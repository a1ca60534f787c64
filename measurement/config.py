"""The agent's configuration: defaults in code, then a YAML file, then command-line flags.

Every field, with its default::

    node:
      name: ""                  # Kubernetes node name; "" = this host's name (the DaemonSet passes
                                #   --node-name $(NODE_NAME) from the downward API)
      site: ""                  # site name written into /v1/profile (optional)
      server_id: ""             # physical server id (NADIKI), written into /v1/profile
      speed: 1.0                # relative throughput per core, written into /v1/profile
      power_cap_watts: null
    interval_seconds: 1.0       # sampling interval, 0.1 .. 60
    roots: {sysfs: /sys, procfs: /proc, cgroup: /sys/fs/cgroup, dev: /dev}
    sources:
      order: [rapl_sysfs, ipmi_dcmi, ipmi_sdr, redfish, nvml]   # rapl_msr is opt-in
      options: {}               # per source, e.g. {redfish: {url: ..., credentials_file: ...}}
      rescan_seconds: 30        # re-list zones (hot-plug)
      server_includes_gpus: false   # does the server reading (IPMI/Redfish) include the GPUs?
    attribution:
      idle_policy: requests     # requests | bucket
      pod_retention_seconds: 300    # keep a deleted pod's counters this long
      cgroup_rescan_seconds: 1.0    # re-list pod cgroups
    anomaly:
      max_zone_watts: 10000     # a delta above this × dt is dropped as implausible
      max_gap_seconds: 30       # a power reading gap longer than this is not integrated
    model: {window_samples: 900, min_samples: 30, min_spread_cores: 0.5, min_spread_gpu: 0.2}
    cross_check: {drift: 0.05, window_seconds: 60}
    kubernetes: {mode: auto, kubeconfig: "", refresh_seconds: 30}   # auto|in-cluster|kubeconfig|off
    server:
      listen: 127.0.0.1:9102
      token_file: ""            # bearer token for the windows API (required off loopback)
    record: {file: ""}          # JSON lines (gzip when it ends in .gz), see docs/agent.md
    sites: {file: ""}           # site file (PUE, WUE, carbon intensity, embodied emissions):
                                #   exported as joulesched_site_* and joulesched_server_* (docs/impact.md)
    nadiki: null                # provider mode: register with a NADIKI registrar and push energy
                                #   (measurement/nadiki/config.py, docs/provider.md)

Unknown keys, numbers given as strings and out-of-range values are all reported at once, each
with its dotted path (``attribution.idle_policy: must be one of requests, bucket, got 'even'``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from joulesched.contracts.documents import read_yaml
from joulesched.measurement.nadiki.config import ProviderConfig, parse_provider_config
from joulesched.measurement.sources.base import Roots
from joulesched.measurement.sources.registry import DEFAULT_ORDER, SOURCES
from joulesched.policy.attribution import IDLE_POLICIES
from joulesched.policy.errors import ConfigError
from joulesched.policy.validate import Checker

MIN_INTERVAL = 0.1
MAX_INTERVAL = 60.0
KUBERNETES_MODES = ("auto", "in-cluster", "kubeconfig", "off")


@dataclass(frozen=True)
class NodeConfig:
    name: str = ""
    site: str = ""
    server_id: str = ""
    speed: float = 1.0
    power_cap_watts: float | None = None


@dataclass(frozen=True)
class SourcesConfig:
    order: tuple[str, ...] = DEFAULT_ORDER
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    rescan_seconds: float = 30.0
    server_includes_gpus: bool = False


@dataclass(frozen=True)
class AttributionConfig:
    idle_policy: str = "requests"
    pod_retention_seconds: float = 300.0
    cgroup_rescan_seconds: float = 1.0


@dataclass(frozen=True)
class AnomalyConfig:
    max_zone_watts: float = 10_000.0
    max_gap_seconds: float = 30.0


@dataclass(frozen=True)
class ModelConfig:
    window_samples: int = 900
    min_samples: int = 30
    min_spread_cores: float = 0.5
    min_spread_gpu: float = 0.2


@dataclass(frozen=True)
class CrossCheckConfig:
    drift: float = 0.05
    window_seconds: float = 60.0


@dataclass(frozen=True)
class KubernetesConfig:
    mode: str = "auto"
    kubeconfig: str = ""
    refresh_seconds: float = 30.0


@dataclass(frozen=True)
class ServerConfig:
    listen: str = "127.0.0.1:9102"
    token_file: str = ""


@dataclass(frozen=True)
class AgentConfig:
    node: NodeConfig = field(default_factory=NodeConfig)
    interval_seconds: float = 1.0
    roots: Roots = field(default_factory=Roots)
    sources: SourcesConfig = field(default_factory=SourcesConfig)
    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    anomaly: AnomalyConfig = field(default_factory=AnomalyConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    cross_check: CrossCheckConfig = field(default_factory=CrossCheckConfig)
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    record_file: str = ""
    site_file: str = ""
    nadiki: ProviderConfig | None = None

    def validate(self) -> list[str]:
        """Every problem of this configuration, each with its dotted path (empty when valid)."""
        problems: list[str] = []

        def need(ok: bool, path: str, message: str) -> None:
            if not ok:
                problems.append(f"{path}: {message}")

        i = self.interval_seconds
        need(
            MIN_INTERVAL <= i <= MAX_INTERVAL,
            "interval_seconds",
            f"must be between {MIN_INTERVAL:g} and {MAX_INTERVAL:g}, got {i!r}",
        )
        need(self.node.speed > 0, "node.speed", f"must be > 0, got {self.node.speed!r}")
        cap = self.node.power_cap_watts
        need(cap is None or cap > 0, "node.power_cap_watts", f"must be > 0, got {cap!r}")
        for name in self.sources.order:
            need(name in SOURCES, "sources.order", f"unknown source {name!r} (known: {', '.join(sorted(SOURCES))})")
        need(len(set(self.sources.order)) == len(self.sources.order), "sources.order", "lists a source twice")
        for name in self.sources.options:
            need(name in SOURCES, f"sources.options.{name}", f"unknown source (known: {', '.join(sorted(SOURCES))})")
        need(
            self.sources.rescan_seconds >= 1,
            "sources.rescan_seconds",
            f"must be >= 1, got {self.sources.rescan_seconds!r}",
        )
        a = self.attribution
        need(
            a.idle_policy in IDLE_POLICIES,
            "attribution.idle_policy",
            f"must be one of {', '.join(IDLE_POLICIES)}, got {a.idle_policy!r}",
        )
        need(
            a.pod_retention_seconds >= 0,
            "attribution.pod_retention_seconds",
            f"must be >= 0, got {a.pod_retention_seconds!r}",
        )
        need(
            a.cgroup_rescan_seconds > 0,
            "attribution.cgroup_rescan_seconds",
            f"must be > 0, got {a.cgroup_rescan_seconds!r}",
        )
        need(
            self.anomaly.max_zone_watts > 0,
            "anomaly.max_zone_watts",
            f"must be > 0, got {self.anomaly.max_zone_watts!r}",
        )
        need(
            self.anomaly.max_gap_seconds >= i,
            "anomaly.max_gap_seconds",
            f"must be >= interval_seconds ({i:g}), got {self.anomaly.max_gap_seconds!r}",
        )
        m = self.model
        need(m.window_samples >= 2, "model.window_samples", f"must be >= 2, got {m.window_samples!r}")
        need(
            2 <= m.min_samples <= max(m.window_samples, 2),
            "model.min_samples",
            f"must be between 2 and window_samples, got {m.min_samples!r}",
        )
        need(m.min_spread_cores >= 0, "model.min_spread_cores", f"must be >= 0, got {m.min_spread_cores!r}")
        need(0 <= m.min_spread_gpu <= 1, "model.min_spread_gpu", f"must be between 0 and 1, got {m.min_spread_gpu!r}")
        need(
            0 < self.cross_check.drift < 1,
            "cross_check.drift",
            f"must be between 0 and 1, got {self.cross_check.drift!r}",
        )
        need(
            self.cross_check.window_seconds >= i,
            "cross_check.window_seconds",
            f"must be >= interval_seconds, got {self.cross_check.window_seconds!r}",
        )
        k = self.kubernetes
        need(
            k.mode in KUBERNETES_MODES,
            "kubernetes.mode",
            f"must be one of {', '.join(KUBERNETES_MODES)}, got {k.mode!r}",
        )
        need(
            k.mode != "kubeconfig" or bool(k.kubeconfig),
            "kubernetes.kubeconfig",
            "is required when kubernetes.mode is kubeconfig",
        )
        need(k.refresh_seconds >= 1, "kubernetes.refresh_seconds", f"must be >= 1, got {k.refresh_seconds!r}")
        try:
            parse_listen(self.server.listen)
        except ValueError as err:
            problems.append(f"server.listen: {err}")
        return problems


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[v6]:PORT`` or ``:PORT`` (all interfaces) → (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT with a port 0..65535, got {listen!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge two mappings (flags over file over defaults); the override wins leaf by leaf."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


_TOP = (
    "node",
    "interval_seconds",
    "roots",
    "sources",
    "attribution",
    "anomaly",
    "model",
    "cross_check",
    "kubernetes",
    "server",
    "record",
    "sites",
    "nadiki",
)


def parse_agent_config(doc: Any, where: str = "agent config") -> AgentConfig:
    """Build an AgentConfig from a mapping; raise ConfigError listing every problem."""
    check = Checker(where)
    d = AgentConfig()
    root = check.mapping(doc, "")
    check.unknown_keys(root, _TOP, "")

    def section(name: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
        body = check.mapping(root.get(name), name)
        check.unknown_keys(body, allowed, name)
        return body

    def num(body: Mapping[str, Any], key: str, path: str, default: float | None) -> Any:
        value = check.number(body, key, path, default=default)
        return default if value is None else value

    def text(body: Mapping[str, Any], key: str, path: str, default: str) -> str:
        value = body.get(key)
        if value == "":
            return ""
        return check.string(body, key, path, default=default) or default

    n = section("node", ("name", "site", "server_id", "speed", "power_cap_watts"))
    node = NodeConfig(
        name=text(n, "name", "node", d.node.name),
        site=text(n, "site", "node", d.node.site),
        server_id=text(n, "server_id", "node", d.node.server_id),
        speed=num(n, "speed", "node", d.node.speed),
        power_cap_watts=num(n, "power_cap_watts", "node", None),
    )
    interval = num(root, "interval_seconds", "", d.interval_seconds)
    r = section("roots", ("sysfs", "procfs", "cgroup", "dev"))
    roots = Roots(
        sysfs=text(r, "sysfs", "roots", d.roots.sysfs),
        procfs=text(r, "procfs", "roots", d.roots.procfs),
        cgroup=text(r, "cgroup", "roots", d.roots.cgroup),
        dev=text(r, "dev", "roots", d.roots.dev),
    )
    s = section("sources", ("order", "options", "rescan_seconds", "server_includes_gpus"))
    order = d.sources.order
    if "order" in s:
        raw = s["order"]
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            check.problem("sources.order", f"must be a list of source names, got {raw!r}")
        else:
            order = tuple(raw)
    options_raw = check.mapping(s.get("options"), "sources.options")
    options: dict[str, Mapping[str, Any]] = {}
    for name, body in options_raw.items():
        options[str(name)] = dict(check.mapping(body, f"sources.options.{name}"))
    sources = SourcesConfig(
        order=order,
        options=options,
        rescan_seconds=num(s, "rescan_seconds", "sources", d.sources.rescan_seconds),
        server_includes_gpus=check.boolean(
            s, "server_includes_gpus", "sources", default=d.sources.server_includes_gpus
        ),
    )
    a = section("attribution", ("idle_policy", "pod_retention_seconds", "cgroup_rescan_seconds"))
    attribution = AttributionConfig(
        idle_policy=text(a, "idle_policy", "attribution", d.attribution.idle_policy),
        pod_retention_seconds=num(a, "pod_retention_seconds", "attribution", d.attribution.pod_retention_seconds),
        cgroup_rescan_seconds=num(a, "cgroup_rescan_seconds", "attribution", d.attribution.cgroup_rescan_seconds),
    )
    an = section("anomaly", ("max_zone_watts", "max_gap_seconds"))
    anomaly = AnomalyConfig(
        max_zone_watts=num(an, "max_zone_watts", "anomaly", d.anomaly.max_zone_watts),
        max_gap_seconds=num(an, "max_gap_seconds", "anomaly", d.anomaly.max_gap_seconds),
    )
    m = section("model", ("window_samples", "min_samples", "min_spread_cores", "min_spread_gpu"))
    window = num(m, "window_samples", "model", d.model.window_samples)
    min_samples = num(m, "min_samples", "model", d.model.min_samples)
    for key, value in (("window_samples", window), ("min_samples", min_samples)):
        if value != int(value):
            check.problem(f"model.{key}", f"must be a whole number, got {value!r}")
    model = ModelConfig(
        window_samples=int(window),
        min_samples=int(min_samples),
        min_spread_cores=num(m, "min_spread_cores", "model", d.model.min_spread_cores),
        min_spread_gpu=num(m, "min_spread_gpu", "model", d.model.min_spread_gpu),
    )
    c = section("cross_check", ("drift", "window_seconds"))
    cross = CrossCheckConfig(
        drift=num(c, "drift", "cross_check", d.cross_check.drift),
        window_seconds=num(c, "window_seconds", "cross_check", d.cross_check.window_seconds),
    )
    k = section("kubernetes", ("mode", "kubeconfig", "refresh_seconds"))
    if k.get("mode") is False:  # YAML 1.1 reads a bare off as false
        check.problem("kubernetes.mode", 'YAML read the bare word off as false: quote it (mode: "off")')
        k = {key: value for key, value in k.items() if key != "mode"}
    kube = KubernetesConfig(
        mode=text(k, "mode", "kubernetes", d.kubernetes.mode),
        kubeconfig=text(k, "kubeconfig", "kubernetes", d.kubernetes.kubeconfig),
        refresh_seconds=num(k, "refresh_seconds", "kubernetes", d.kubernetes.refresh_seconds),
    )
    sv = section("server", ("listen", "token_file"))
    server = ServerConfig(
        listen=text(sv, "listen", "server", d.server.listen),
        token_file=text(sv, "token_file", "server", d.server.token_file),
    )
    rec = section("record", ("file",))
    sites = section("sites", ("file",))
    nadiki = None
    if root.get("nadiki") is not None:
        try:
            nadiki = parse_provider_config(root["nadiki"], where)
        except ConfigError as err:
            check.problems.extend(err.problems)
    config = AgentConfig(
        node=node,
        interval_seconds=interval,
        roots=roots,
        sources=sources,
        attribution=attribution,
        anomaly=anomaly,
        model=model,
        cross_check=cross,
        kubernetes=kube,
        server=server,
        record_file=text(rec, "file", "record", d.record_file),
        site_file=text(sites, "file", "sites", d.site_file),
        nadiki=nadiki,
    )
    # Fields with a type problem fell back to their (valid) defaults, so validate() adds only
    # the range problems of the values that were read: every problem is reported in one pass.
    for problem in config.validate():
        if problem not in check.problems:
            check.problems.append(problem)
    check.raise_if_any()
    return config


def load_config(path: str | None, overrides: Mapping[str, Any] | None = None) -> AgentConfig:
    """Defaults, then the YAML file at ``path`` (if any), then ``overrides`` (from flags)."""
    doc: Mapping[str, Any] = {}
    where = path or "command line"
    if path:
        loaded = read_yaml(path)
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, Mapping):
            raise ConfigError(path, [f"must be a mapping at the top, got {type(loaded).__name__}"])
        doc = loaded
    return parse_agent_config(merge(doc, overrides or {}), where)


__all__ = [
    "AgentConfig",
    "AnomalyConfig",
    "AttributionConfig",
    "CrossCheckConfig",
    "KubernetesConfig",
    "ModelConfig",
    "NodeConfig",
    "ServerConfig",
    "SourcesConfig",
    "is_loopback",
    "load_config",
    "merge",
    "parse_agent_config",
    "parse_listen",
]
