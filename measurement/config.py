"""The agent's configuration: defaults in code, then a YAML file, then command-line flags.

Each field is declared once below, with its default, bounds and meaning (``setting``); the
parser, :meth:`AgentConfig.validate` and the reference table in docs/agent.md
(``python -m joulesched.configdoc``) derive from those declarations. ``nadiki`` is the provider
section (measurement/nadiki/config.py, docs/provider.md).

Unknown keys, numbers given as strings and out-of-range values are all reported at once, each
with its dotted path (``attribution.idle_policy: must be one of requests, bucket, got 'even'``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from joulesched.contracts.documents import read_yaml
from joulesched.contracts.net import is_loopback_host as is_loopback
from joulesched.measurement.nadiki.config import ProviderConfig, parse_provider_config
from joulesched.measurement.sources.base import Roots
from joulesched.measurement.sources.registry import DEFAULT_ORDER, SOURCES, option_problems
from joulesched.policy.attribution import IDLE_POLICIES
from joulesched.policy.errors import ConfigError
from joulesched.policy.validate import Checker, limit_problems, read_values, setting

MIN_INTERVAL = 0.1
MAX_INTERVAL = 60.0
KUBERNETES_MODES = ("auto", "in-cluster", "kubeconfig", "off")


@dataclass(frozen=True)
class NodeConfig:
    name: str = setting(
        "",
        "Kubernetes node name (`--node-name`; the DaemonSet passes the downward API's `spec.nodeName`)",
        empty_ok=True,
        shown="host name",
    )
    site: str = setting("", "site name, written into `/v1/profile` and `joulesched_node_info`", empty_ok=True)
    server_id: str = setting(
        "", "physical server id (NADIKI), written into `/v1/profile` and `joulesched_node_info` (there, and on the server gauges, the node name when empty)", empty_ok=True
    )
    speed: float = setting(1.0, "relative throughput per core, written into the profile", exclusive_minimum=0)
    power_cap_watts: float | None = setting(None, "written into the profile", kind="number", exclusive_minimum=0)


@dataclass(frozen=True)
class SourcesConfig:
    order: tuple[str, ...] = setting(
        DEFAULT_ORDER, "sources tried, in this order; add `rapl_msr` to opt in", kind="custom"
    )
    options: Mapping[str, Mapping[str, Any]] = setting(
        doc="each source's options ([sources.md](sources.md)), by source name", kind="custom", factory=dict, shown="{}"
    )
    rescan_seconds: float = setting(30.0, "re-list zones; full pod rescan", minimum=1)
    server_includes_gpus: bool = setting(False, "does the server reading (IPMI/Redfish) include the GPUs?")
    read_wait_seconds: float = setting(
        0.05,
        "a sample or a window edge waits this long for each source's fresh reading; a slower source's reading"
        " counts when it arrives",
        minimum=0,
        maximum=5,
        between=True,
    )
    retry_initial_seconds: float = setting(
        1.0, "first wait before a failed source (read or start) is tried again; doubles each failure", minimum=0.01
    )
    retry_max_seconds: float = setting(30.0, "the longest wait between tries of a failed source", minimum=0.01)
    power_window_seconds: float = setting(
        10.0, "power gauges are each zone's energy change over this window", exclusive_minimum=0
    )


@dataclass(frozen=True)
class AttributionConfig:
    idle_policy: str = setting("requests", "who pays for idle power", choices=IDLE_POLICIES, empty_ok=True)
    pod_retention_seconds: float = setting(300.0, "keep a deleted pod's series this long", minimum=0)
    cgroup_rescan_seconds: float = setting(1.0, "look for new or deleted pods", exclusive_minimum=0)


@dataclass(frozen=True)
class AnomalyConfig:
    max_zone_watts: float = setting(10_000.0, "a zone delta above this × dt is dropped", exclusive_minimum=0)
    max_gap_seconds: float | None = setting(
        None,
        "power readings up to this far apart are integrated (the trapezoid between them); a longer gap is estimated"
        " from the power model; raise it for a BMC whose reads take longer than an interval",
        kind="number",
        exclusive_minimum=0,
        shown="2.5 × `interval_seconds`",
    )


@dataclass(frozen=True)
class ModelConfig:
    window_samples: int = setting(900, "rolling fit window (15 min at 1 s)", minimum=2)
    min_samples: int = setting(30, "samples before a fit; 2 … `window_samples`")
    min_spread_cores: float = setting(0.5, "load spread (cores) needed for a CPU slope", minimum=0)
    min_spread_gpu: float = setting(0.2, "load spread needed for a GPU slope", minimum=0, maximum=1, between=True)


@dataclass(frozen=True)
class CrossCheckConfig:
    drift: float = setting(0.05, "cross-check threshold; between 0 and 1, exclusive")
    window_seconds: float = setting(60.0, "cross-check window; >= `interval_seconds`")


@dataclass(frozen=True)
class KubernetesConfig:
    mode: str = setting("auto", 'how pods are named (quote `"off"` in YAML)', choices=KUBERNETES_MODES, empty_ok=True)
    kubeconfig: str = setting("", "required for `kubeconfig`", empty_ok=True)
    refresh_seconds: float = setting(30.0, "pod list refresh", minimum=1)


@dataclass(frozen=True)
class ServerConfig:
    listen: str = setting("127.0.0.1:9102", "`--listen`; `:9102` for all interfaces", empty_ok=True)
    token_file: str = setting("", "bearer token for the windows API (required off loopback)", empty_ok=True)
    state_dir: str = setting(
        "",
        "directory where open windows and their counter offsets are kept (atomically) so that they survive a restart"
        " (a hostPath or emptyDir in the DaemonSet); empty: a restart loses them",
        empty_ok=True,
    )


@dataclass(frozen=True)
class AgentConfig:
    """Every field once, with its default, bounds and meaning: :func:`parse_agent_config`,
    :meth:`validate` and the table in docs/agent.md derive from these. ``roots`` (the sources'
    ``Roots``), ``sources.order``, ``sources.options`` and ``nadiki`` are structured and read by
    their own code in :func:`parse_agent_config`; cross-field rules are in :meth:`validate`."""

    node: NodeConfig = setting(doc="", factory=NodeConfig)
    interval_seconds: float = setting(
        1.0, "sampling interval (`--interval`)", minimum=MIN_INTERVAL, maximum=MAX_INTERVAL, between=True
    )
    roots: Roots = setting(
        doc="the host trees `sysfs`, `procfs`, `cgroup`, `dev` (`--sysfs-root` …)",
        kind="custom",
        factory=Roots,
        shown="`/sys`, `/proc`, `/sys/fs/cgroup`, `/dev`",
    )
    sources: SourcesConfig = setting(doc="", factory=SourcesConfig)
    attribution: AttributionConfig = setting(doc="", factory=AttributionConfig)
    anomaly: AnomalyConfig = setting(doc="", factory=AnomalyConfig)
    model: ModelConfig = setting(doc="", factory=ModelConfig)
    cross_check: CrossCheckConfig = setting(doc="", factory=CrossCheckConfig)
    kubernetes: KubernetesConfig = setting(doc="", factory=KubernetesConfig)
    server: ServerConfig = setting(doc="", factory=ServerConfig)
    record_file: str = setting("", "`--record`: JSON lines, see below", key="record.file", empty_ok=True)
    site_file: str = setting(
        "",
        "site file ([impact.md](impact.md)): exports this node's `joulesched_site_*` and `joulesched_server_*` gauges",
        key="sites.file",
        empty_ok=True,
    )
    nadiki: ProviderConfig | None = setting(
        None,
        "provider mode: register this physical server with a NADIKI registrar and push its energy counters"
        " ([provider.md](provider.md)); registration is retried every 60 s while the registrar fails,"
        " sampling and `/metrics` go on meanwhile",
        kind="custom",
    )

    def validate(self) -> list[str]:
        """Every problem of this configuration, each with its dotted path (empty when valid)."""
        # bounds and choices declared with the fields, then the rules between fields
        problems: list[str] = limit_problems(self)

        def need(ok: bool, path: str, message: str) -> None:
            if not ok:
                problems.append(f"{path}: {message}")

        i = self.interval_seconds
        for name in self.sources.order:
            need(name in SOURCES, "sources.order", f"unknown source {name!r} (known: {', '.join(sorted(SOURCES))})")
        need(len(set(self.sources.order)) == len(self.sources.order), "sources.order", "lists a source twice")
        for name, options in self.sources.options.items():
            need(name in SOURCES, f"sources.options.{name}", f"unknown source (known: {', '.join(sorted(SOURCES))})")
            problems.extend(f"sources.options.{name}.{problem}" for problem in option_problems(name, options))
        need(
            self.sources.retry_max_seconds >= self.sources.retry_initial_seconds,
            "sources.retry_max_seconds",
            f"must be >= sources.retry_initial_seconds ({self.sources.retry_initial_seconds:g})",
        )
        m = self.model
        need(
            2 <= m.min_samples <= max(m.window_samples, 2),
            "model.min_samples",
            f"must be between 2 and window_samples, got {m.min_samples!r}",
        )
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
            k.mode != "kubeconfig" or bool(k.kubeconfig),
            "kubernetes.kubeconfig",
            "is required when kubernetes.mode is kubeconfig",
        )
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


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge two mappings (flags over file over defaults); the override wins leaf by leaf."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_agent_config(doc: Any, where: str = "agent config") -> AgentConfig:
    """Build an AgentConfig from a mapping; raise ConfigError listing every problem."""
    check = Checker(where)
    root = check.mapping(doc, "")
    kube = root.get("kubernetes")
    if isinstance(kube, Mapping) and kube.get("mode") is False:  # YAML 1.1 reads a bare off as false
        check.problem("kubernetes.mode", 'YAML read the bare word off as false: quote it (mode: "off")')
        root = {**root, "kubernetes": {key: value for key, value in kube.items() if key != "mode"}}
    # kinds here; bounds and choices in validate(), which also checks configs built in code
    values = read_values(AgentConfig, root, check, "", limits=False)

    # Bespoke: the structured parts (Roots belongs to the sources; order is a list, options a
    # mapping of mappings, nadiki a document of its own).
    d = AgentConfig()
    r = check.mapping(root.get("roots"), "roots")
    check.unknown_keys(r, ("sysfs", "procfs", "cgroup", "dev"), "roots")

    def text(key: str, default: str) -> str:
        value = r.get(key)
        if value == "":
            return ""
        return check.string(r, key, "roots", default=default) or default

    roots = Roots(
        sysfs=text("sysfs", d.roots.sysfs),
        procfs=text("procfs", d.roots.procfs),
        cgroup=text("cgroup", d.roots.cgroup),
        dev=text("dev", d.roots.dev),
    )
    s = check.mapping(root.get("sources"), "sources")
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
    nadiki = None
    if root.get("nadiki") is not None:
        try:
            nadiki = parse_provider_config(root["nadiki"], where)
        except ConfigError as err:
            check.problems.extend(err.problems)
    config = AgentConfig(
        **{**values, "sources": replace(values["sources"], order=order, options=options)},
        roots=roots,
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
