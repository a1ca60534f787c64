"""The cluster spec: node types with measured power curves, the sites they stand in, the autoscaler.

::

    name: example
    start: 2022-06-01T00:00:00Z      # wall-clock time of simulated t = 0 (for carbon series)
    sites:
      bpat-hydro:
        pue: 1.10                    # facility energy = IT energy × PUE
        wue: 0.30                    # litres of water per IT kWh (The Green Grid WUE; optional)
        carbon_intensity: 55         # gCO2e/kWh, constant ...
        # ... or an hourly series (paths relative to this file):
        # carbon_series: {file: ../carbon/BPAT_2022_hourly.csv, column: avg_CI, missing: interpolate}
        zone: us-west                # topology.kubernetes.io/zone of its nodes (default: the site name)
    node_types:
      - name: epyc-7763
        count: 8
        site: bpat-hydro
        cores: 128                   # allocatable logical CPUs (the power curve spans them)
        memory: 512Gi                # allocatable memory: a Kubernetes quantity or bytes
        power_curve_watts: [56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268]
        # or: idle_watts: 56.8, watts_per_core: 1.65
        speed: 1.0                   # throughput per core relative to the trace's machine
        max_pods: 110
        gpus: {count: 0}             # or {count: 4, idle_watts: 60, max_watts: 400, speed: 1.0, model: A100}
        power_cap_watts: 300         # optional
        min_count: 0                 # the autoscaler never goes below this many running
        source: "SPECpower_ssj2008, HPE ProLiant DL325 Gen10 Plus, 2021"
    autoscaler:                      # cluster-autoscaler-like (optional)
      enabled: true
      scale_down_unneeded_seconds: 600   # an empty node is removed after this long
      scale_up_delay_seconds: 120        # a new node is Ready this long after a pod pends
      expander: random                   # random | least-waste | priority (most efficient type: policy.efficiency)

Every problem is reported at once with its dotted path (``node_types[1].cores: must be > 0,
got -4``), and the file it came from.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from joulesched.contracts.documents import read_yaml
from joulesched.policy.demand import QuantityError, parse_quantity
from joulesched.policy.errors import ConfigError
from joulesched.policy.profile import CURVE_POINTS, linear_curve
from joulesched.policy.validate import Checker
from joulesched.sim.carbon import HOUR, MISSING_POLICIES, SiteCarbon, parse_start, read_hourly_series
from joulesched.sim.errors import ClusterError

DEFAULT_START = "2022-06-01T00:00:00Z"
DEFAULT_MAX_PODS = 110  # kubelet's default maxPods
EXPANDERS = ("random", "least-waste", "priority")
ZONE_LABEL = "topology.kubernetes.io/zone"

TOP_FIELDS = ("name", "start", "sites", "node_types", "autoscaler", "description")
SITE_FIELDS = ("pue", "wue", "carbon_intensity", "carbon_series", "zone", "renewable_share", "description")
TYPE_FIELDS = (
    "name",
    "count",
    "site",
    "cores",
    "memory",
    "power_curve_watts",
    "idle_watts",
    "watts_per_core",
    "speed",
    "max_pods",
    "gpus",
    "power_cap_watts",
    "min_count",
    "source",
)
GPU_FIELDS = ("count", "idle_watts", "max_watts", "speed", "model")
AUTOSCALER_FIELDS = ("enabled", "scale_down_unneeded_seconds", "scale_up_delay_seconds", "expander")


@dataclass(frozen=True)
class SiteSpec:
    name: str
    pue: float = 1.0
    wue: float = 0.0
    carbon: SiteCarbon = field(default_factory=lambda: SiteCarbon.constant(0.0))
    zone: str = ""
    renewable_share: float = 0.0


@dataclass(frozen=True)
class GpuSpec:
    count: int = 0
    idle_watts: float = 0.0
    max_watts: float = 0.0
    speed: float = 1.0
    model: str = ""


@dataclass(frozen=True)
class NodeType:
    name: str
    count: int
    site: str
    cores: float
    memory_bytes: float
    power_curve_watts: tuple[float, ...]
    speed: float = 1.0
    max_pods: int = DEFAULT_MAX_PODS
    gpus: GpuSpec = field(default_factory=GpuSpec)
    power_cap_watts: float | None = None
    min_count: int = 0
    source: str = ""


@dataclass(frozen=True)
class AutoscalerSpec:
    enabled: bool = False
    scale_down_unneeded_seconds: float = 600.0  # cluster-autoscaler --scale-down-unneeded-time
    scale_up_delay_seconds: float = 120.0
    expander: str = "random"  # cluster-autoscaler's default expander


@dataclass(frozen=True)
class Node:
    name: str
    type_index: int
    site: str
    zone: str


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    start: float  # unix seconds of simulated t = 0
    sites: Mapping[str, SiteSpec]
    node_types: tuple[NodeType, ...]
    autoscaler: AutoscalerSpec = field(default_factory=AutoscalerSpec)
    source: str = ""

    def nodes(self) -> list[Node]:
        """Every node, in kube-scheduler's list order: round-robin over zones (its node tree)."""
        by_zone: dict[str, list[Node]] = {}
        for ti, nt in enumerate(self.node_types):
            site = self.sites[nt.site]
            zone = site.zone or site.name
            for k in range(nt.count):
                by_zone.setdefault(zone, []).append(Node(f"{nt.name}-{k:03d}", ti, nt.site, zone))
        out: list[Node] = []
        queues = list(by_zone.values())
        depth = max((len(q) for q in queues), default=0)
        for i in range(depth):
            out.extend(q[i] for q in queues if i < len(q))
        return out

    @property
    def node_count(self) -> int:
        return sum(nt.count for nt in self.node_types)


def load_cluster(path: str | Path) -> ClusterSpec:
    file = Path(path)
    doc = read_yaml(file, ClusterError)
    return parse_cluster(doc, str(file), base_dir=file.parent)


def parse_cluster(doc: Any, where: str, base_dir: Path | None = None) -> ClusterSpec:
    check = Checker(where)
    root = check.mapping(doc, "")
    check.unknown_keys(root, TOP_FIELDS, "")
    name = check.string(root, "name", "", default=Path(where).stem) or "cluster"
    raw_start = root.get("start")
    if isinstance(raw_start, datetime):  # YAML reads an unquoted timestamp as a datetime
        aware = raw_start if raw_start.tzinfo else raw_start.replace(tzinfo=UTC)
        start_text = aware.isoformat()
    else:
        start_text = check.string(root, "start", "", default=DEFAULT_START) or DEFAULT_START
    try:
        start = parse_start(start_text, where)
    except ClusterError as err:
        check.problems.extend(err.problems)
        start = parse_start(DEFAULT_START, where)

    sites: dict[str, SiteSpec] = {}
    for site_name, body in check.mapping(root.get("sites"), "sites").items():
        site = _parse_site(str(site_name), body, f"sites.{site_name}", check, start, base_dir)
        if site is not None:
            sites[str(site_name)] = site

    types: list[NodeType] = []
    seen: set[str] = set()
    raw_types = check.list_of(root, "node_types", "")
    if not raw_types and "node_types" not in root:
        check.problem("node_types", "is required (a list of node types)")
    for i, body in enumerate(raw_types):
        nt = _parse_type(body, f"node_types[{i}]", check, sites)
        if nt is None:
            continue
        if nt.name in seen:
            check.problem(f"node_types[{i}].name", f"duplicate node type {nt.name!r}")
            continue
        seen.add(nt.name)
        types.append(nt)

    auto = check.mapping(root.get("autoscaler"), "autoscaler")
    check.unknown_keys(auto, AUTOSCALER_FIELDS, "autoscaler")
    d = AutoscalerSpec()
    # present, even empty (every setting at its default), is on unless enabled: false
    enabled = check.boolean(auto, "enabled", "autoscaler", default=root.get("autoscaler") is not None or bool(auto))
    down = check.number(
        auto, "scale_down_unneeded_seconds", "autoscaler", default=d.scale_down_unneeded_seconds, minimum=0.0
    )
    up = check.number(auto, "scale_up_delay_seconds", "autoscaler", default=d.scale_up_delay_seconds, minimum=0.0)
    expander = check.string(auto, "expander", "autoscaler", default=d.expander, choices=EXPANDERS) or d.expander
    if not raw_types and "node_types" in root:
        check.problem("node_types", "the cluster has no node types (an empty list)")
    elif types and sum(t.count for t in types) == 0:
        check.problem("node_types", "the cluster has no nodes (every count is 0)")
    try:
        check.raise_if_any()
    except ConfigError as err:
        raise ClusterError(where, err.problems) from err
    autoscaler = AutoscalerSpec(
        enabled=enabled,
        scale_down_unneeded_seconds=down if down is not None else d.scale_down_unneeded_seconds,
        scale_up_delay_seconds=up if up is not None else d.scale_up_delay_seconds,
        expander=expander,
    )
    return ClusterSpec(name, start, sites, tuple(types), autoscaler, where)


def _parse_site(
    name: str, body: Any, path: str, check: Checker, start: float, base_dir: Path | None
) -> SiteSpec | None:
    body = check.mapping(body, path)
    check.unknown_keys(body, SITE_FIELDS, path)
    pue = check.number(body, "pue", path, default=1.0, minimum=1.0)
    wue = check.number(body, "wue", path, default=0.0, minimum=0.0)
    share = check.number(body, "renewable_share", path, default=0.0, minimum=0.0, maximum=1.0)
    zone = check.string(body, "zone", path, default=name) or name
    if "carbon_intensity" in body and "carbon_series" in body:
        check.problem(path, "give either carbon_intensity or carbon_series, not both")
        return None
    carbon: SiteCarbon | None = None
    if "carbon_series" in body:
        series = check.mapping(body.get("carbon_series"), f"{path}.carbon_series")
        check.unknown_keys(series, ("file", "column", "missing"), f"{path}.carbon_series")
        file = check.string(series, "file", f"{path}.carbon_series")
        column = check.string(series, "column", f"{path}.carbon_series", default="avg_CI") or "avg_CI"
        missing = check.string(
            series, "missing", f"{path}.carbon_series", default="interpolate", choices=MISSING_POLICIES
        )
        if file is not None and missing is not None:
            resolved = Path(file) if Path(file).is_absolute() or base_dir is None else base_dir / file
            try:
                carbon = read_hourly_series(resolved, column, missing=missing, offset=start)
            except ClusterError as err:
                for problem in err.problems:
                    check.problem(f"{path}.carbon_series.file", f"{resolved}: {problem}")
    elif "carbon_intensity" not in body:  # every policy's carbon is reported: 0 g/kWh would be invented
        check.problem(path, "give carbon_intensity (gCO2e/kWh) or carbon_series")
    else:
        ci = check.number(body, "carbon_intensity", path, minimum=0.0)
        if ci is not None:
            carbon = SiteCarbon.constant(ci)
    if None in (pue, wue, share) or carbon is None:
        return None
    return SiteSpec(name, pue, wue, carbon, zone, share)  # type: ignore[arg-type]


def _parse_type(body: Any, path: str, check: Checker, sites: Mapping[str, SiteSpec]) -> NodeType | None:
    before = len(check.problems)
    body = check.mapping(body, path)
    check.unknown_keys(body, TYPE_FIELDS, path)
    name = check.string(body, "name", path)
    count = check.number(body, "count", path, minimum=0.0)
    site = check.string(body, "site", path)
    if site is not None and site not in sites:
        check.problem(f"{path}.site", f"unknown site {site!r} (defined: {', '.join(sorted(sites)) or 'none'})")
    cores = check.number(body, "cores", path, exclusive_minimum=0.0)
    memory = _quantity(body, "memory", path, check)
    curve = check.numbers(body, "power_curve_watts", path, length=CURVE_POINTS, minimum=0.0)
    if curve is not None:
        if "idle_watts" in body or "watts_per_core" in body:
            check.problem(path, "give either power_curve_watts or idle_watts + watts_per_core, not both")
        elif any(b < a for a, b in itertools.pairwise(curve)):
            check.problem(f"{path}.power_curve_watts", "must not decrease with load")
    elif "idle_watts" in body or "watts_per_core" in body:
        idle = check.number(body, "idle_watts", path, minimum=0.0)
        per_core = check.number(body, "watts_per_core", path, minimum=0.0)
        if idle is not None and per_core is not None and cores is not None:
            curve = list(linear_curve(idle, per_core, cores))
    else:
        check.problem(f"{path}.power_curve_watts", "is required (or idle_watts + watts_per_core)")
    speed = check.number(body, "speed", path, default=1.0, exclusive_minimum=0.0)
    max_pods = check.number(body, "max_pods", path, default=float(DEFAULT_MAX_PODS), minimum=1.0)
    cap = check.number(body, "power_cap_watts", path, default=None, exclusive_minimum=0.0)
    min_count = check.number(body, "min_count", path, default=0.0, minimum=0.0)
    source = check.string(body, "source", path, default="") or ""
    for key, value in (("count", count), ("max_pods", max_pods), ("min_count", min_count)):
        if value is not None and value != int(value):
            check.problem(f"{path}.{key}", f"must be a whole number, got {value:g}")
    if count is not None and min_count is not None and min_count > count:
        check.problem(f"{path}.min_count", f"must be <= count ({count:g}), got {min_count:g}")
    gpus = _parse_gpus(body.get("gpus"), f"{path}.gpus", check)
    if len(check.problems) > before:
        return None
    assert name and count is not None and site and cores is not None and memory is not None and curve is not None
    return NodeType(
        name=name,
        count=int(count),
        site=site,
        cores=cores,
        memory_bytes=memory,
        power_curve_watts=tuple(curve),
        speed=speed or 1.0,
        max_pods=int(max_pods or DEFAULT_MAX_PODS),
        gpus=gpus or GpuSpec(),
        power_cap_watts=cap,
        min_count=int(min_count or 0),
        source=source,
    )


def _quantity(body: Mapping[str, Any], key: str, path: str, check: Checker) -> float | None:
    where = f"{path}.{key}"
    if key not in body or body[key] is None:
        check.problem(where, "is required (a Kubernetes quantity such as 512Gi, or bytes)")
        return None
    try:
        value = parse_quantity(body[key], where)
    except QuantityError as err:
        check.problem(where, str(err).removeprefix(f"{where}: "))
        return None
    if value <= 0:
        check.problem(where, f"must be > 0, got {body[key]!r}")
        return None
    return value


def _parse_gpus(value: Any, path: str, check: Checker) -> GpuSpec | None:
    if value is None:
        return GpuSpec()
    body = check.mapping(value, path)
    check.unknown_keys(body, GPU_FIELDS, path)
    count = check.number(body, "count", path, default=0.0, minimum=0.0)
    if count is not None and count != int(count):
        check.problem(f"{path}.count", f"must be a whole number, got {count:g}")
        return None
    if not count:
        given = sorted(k for k in body if k != "count")
        if given and "count" not in body:  # GPUs described but not counted: not none, silently
            check.problem(f"{path}.count", f"is required with {', '.join(given)} (0 for a node without GPUs)")
            return None
        return GpuSpec()
    idle = check.number(body, "idle_watts", path, minimum=0.0)
    peak = check.number(body, "max_watts", path, exclusive_minimum=0.0)
    speed = check.number(body, "speed", path, default=1.0, exclusive_minimum=0.0)
    model = check.string(body, "model", path, default="") or ""
    if idle is not None and peak is not None and peak < idle:
        check.problem(f"{path}.max_watts", f"must be >= idle_watts ({idle:g}), got {peak:g}")
        return None
    if None in (idle, peak, speed):
        return None
    return GpuSpec(int(count), idle, peak, speed, model)  # type: ignore[arg-type]


def idle_power_of(cluster: ClusterSpec, nt: NodeType) -> str:
    """``autoscaled`` when the autoscaler may power a node of this type down, else ``always-on``."""
    return "autoscaled" if cluster.autoscaler.enabled and nt.count > nt.min_count else "always-on"


def profile_document(
    cluster: ClusterSpec,
    nodes: list[Node],
    utilisation: list[float],
    gpu_utilisation: list[float],
    carbon_now: Mapping[str, float],
    held: Sequence[bool] | None = None,
) -> dict[str, Any]:
    """The cluster as a profile document (``policy/profile.py``) with live utilisation per node.

    What an extender's ``file`` source reads. Carbon intensity is each site's current value;
    no ``updated`` time is written (a static profile is always fresh), so the extender's clock
    and the simulated clock never have to agree. Each node's ``idle_power`` says whether the
    autoscaler can power it down (``autoscaled``: the autoscaler is on and its type has more
    nodes than ``min_count``) or not (``always-on``). ``held`` (per node: it runs pods) marks
    the empty nodes with ``held_until: 0``; a node with pods is held for as long as nobody
    knows, as the extender's pod watch sees a pod without a declared runtime.
    """
    sites = {
        name: {"pue": s.pue, "carbon_intensity": carbon_now[name], "wue": s.wue, "renewable_share": s.renewable_share}
        for name, s in cluster.sites.items()
    }
    out = []
    for i, node in enumerate(nodes):
        nt = cluster.node_types[node.type_index]
        entry: dict[str, Any] = {
            "name": node.name,
            "site": node.site,
            "cores": nt.cores,
            "memory_bytes": nt.memory_bytes,
            "power_curve_watts": list(nt.power_curve_watts),
            "speed": nt.speed,
            "utilisation": utilisation[i],
            "idle_power": idle_power_of(cluster, nt),
        }
        if held is not None and not held[i]:
            entry["held_until"] = 0.0
        if nt.power_cap_watts is not None:
            entry["power_cap_watts"] = nt.power_cap_watts
        if nt.gpus.count:
            entry["gpus"] = {
                "count": nt.gpus.count,
                "idle_watts": nt.gpus.idle_watts,
                "max_watts": nt.gpus.max_watts,
                "speed": nt.gpus.speed,
                "utilisation": gpu_utilisation[i],
            }
            if nt.gpus.model:
                entry["gpus"]["model"] = nt.gpus.model
        out.append(entry)
    return {"sites": sites, "nodes": out}


__all__ = [
    "HOUR",
    "ZONE_LABEL",
    "AutoscalerSpec",
    "ClusterSpec",
    "GpuSpec",
    "Node",
    "NodeType",
    "SiteSpec",
    "idle_power_of",
    "load_cluster",
    "parse_cluster",
    "profile_document",
]
