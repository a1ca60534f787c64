"""Node profiles: what the policy knows about each node, and the document that carries them.

One document shape serves three readers: the extender's ``file`` source, the measurement
agent's ``GET /v1/profile`` and the simulator's cluster. A document is a mapping::

    sites:                         # optional; nodes refer to a site by name
      dc-north: {pue: 1.10, carbon_intensity: 55}
    nodes:
      - name: node-a               # the Kubernetes node name
        site: dc-north
        cores: 64                  # logical CPUs the power curve spans
        memory_bytes: 549755813888 # the node's memory (optional; carried, not scored)
        power_curve_watts: [56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268]
        # ... or a linear model instead of a curve:
        # idle_watts: 56.8
        # watts_per_core: 3.3      # watts per fully busy core
        speed: 1.0                 # relative throughput per core (reference = 1)
        utilisation: 0.25          # measured CPU utilisation 0..1 (default 0)
        measured_watts: 140        # measured wall power now (optional)
        power_cap_watts: 300       # hard cap (optional)
        # pue: 1.2                 # overrides the site's (optional; so does carbon_intensity)
        # carbon_intensity: 80
        # updated: 1764400000.0    # unix time of the measurement: absent, a static profile that
        #                          # is always fresh; set, the node scores neutral once it is
        #                          # older than policy.max_age_seconds (120 s by default)
        gpus: {count: 8, idle_watts: 60, max_watts: 700, speed: 1.0, utilisation: 0.0}
        idle_power: autoscaled     # autoscaled | power-managed | always-on (default: the policy's)
        held_until: 0              # unix time its current pods keep it powered anyway (optional;
                                   # absent: unknown; 0 or past: an empty node)
        server_id: host-17         # the physical server's id (provider mode; optional)
        sources: [rapl_sysfs, ipmi_dcmi]  # energy sources that measured it (the agent writes it)

The power curve has 11 points: watts at 0 %, 10 %, … 100 % CPU load, as SPECpower results
publish them. A linear model ``idle + watts_per_core × busy cores`` is turned into the same
11 points, so the maths has one mechanism. Site values (PUE, grid carbon intensity) may be
overridden per node. A node whose intensity neither it nor its site gives has none (NaN,
unknown): under ``strategy: carbon`` it scores neutral, never 0 g and the best.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise
from typing import Any

import numpy as np

from joulesched.policy.validate import Checker

CURVE_POINTS = 11  # 0 %, 10 %, ..., 100 %

NODE_FIELDS = (
    "name",
    "site",
    "cores",
    "memory_bytes",
    "power_curve_watts",
    "idle_watts",
    "watts_per_core",
    "speed",
    "utilisation",
    "measured_watts",
    "power_cap_watts",
    "updated",
    "gpus",
    "pue",
    "carbon_intensity",
    "sources",
    "server_id",
    "idle_power",
    "held_until",
)
GPU_FIELDS = ("count", "idle_watts", "max_watts", "speed", "utilisation", "model")
SITE_FIELDS = ("pue", "carbon_intensity", "wue", "renewable_share")

DEFAULT_PUE = 1.0
DEFAULT_CARBON_INTENSITY = math.nan  # gCO2e/kWh: not given, unknown (never 0 g, which would win under carbon)

# Whether a node's idle power can be avoided (docs/policy.md, "Idle power"): a node of an
# autoscaled node group or a power-managed bare-metal server is powered down when it is empty,
# so a pod that keeps it on pays its idle power; an always-on node draws it whatever happens.
IDLE_POWER_CLASSES = ("autoscaled", "power-managed", "always-on")
AVOIDABLE_IDLE = frozenset({"autoscaled", "power-managed"})


@dataclass(frozen=True)
class GpuProfile:
    count: int
    idle_watts: float  # per GPU
    max_watts: float  # per GPU, at full load (board power)
    speed: float = 1.0  # relative throughput per GPU
    utilisation: float = 0.0  # mean utilisation of the node's GPUs, 0..1
    model: str = ""


@dataclass(frozen=True)
class Site:
    name: str
    pue: float = DEFAULT_PUE
    carbon_intensity: float = DEFAULT_CARBON_INTENSITY  # gCO2e per kWh
    wue: float = 0.0  # litres per kWh
    renewable_share: float = 0.0  # 0..1


@dataclass(frozen=True)
class NodeProfile:
    name: str
    cores: float
    power_curve_watts: tuple[float, ...]  # CURVE_POINTS values
    site: str = ""
    memory_bytes: float = 0.0
    speed: float = 1.0
    utilisation: float = 0.0
    measured_watts: float | None = None
    power_cap_watts: float | None = None
    updated: float | None = None
    gpus: GpuProfile | None = None
    pue: float = DEFAULT_PUE
    carbon_intensity: float = DEFAULT_CARBON_INTENSITY
    sources: tuple[str, ...] = ()
    server_id: str = ""
    idle_power: str = ""  # one of IDLE_POWER_CLASSES; "" = the policy's default
    held_until: float | None = None  # unix time until which its current pods keep it powered

    @property
    def idle_watts(self) -> float:
        return self.power_curve_watts[0]

    def to_document(self) -> dict[str, Any]:
        """The profile as one entry of a profile document (the inverse of parsing)."""
        doc: dict[str, Any] = {
            "name": self.name,
            "cores": self.cores,
            "power_curve_watts": list(self.power_curve_watts),
            "speed": self.speed,
            "utilisation": self.utilisation,
            "pue": self.pue,
        }
        optional: dict[str, Any] = {
            "carbon_intensity": None if math.isnan(self.carbon_intensity) else self.carbon_intensity,
            "site": self.site or None,
            "memory_bytes": self.memory_bytes or None,
            "measured_watts": self.measured_watts,
            "power_cap_watts": self.power_cap_watts,
            "updated": self.updated,
            "sources": list(self.sources) or None,
            "server_id": self.server_id or None,
            "idle_power": self.idle_power or None,
            "held_until": self.held_until,
        }
        doc.update({k: v for k, v in optional.items() if v is not None})
        if self.gpus is not None:
            g = self.gpus
            doc["gpus"] = {
                "count": g.count,
                "idle_watts": g.idle_watts,
                "max_watts": g.max_watts,
                "speed": g.speed,
                "utilisation": g.utilisation,
            }
            if g.model:
                doc["gpus"]["model"] = g.model
        return doc


@dataclass(frozen=True)
class ProfileSet:
    """Every node profile of one document, with its sites."""

    nodes: tuple[NodeProfile, ...]
    sites: Mapping[str, Site] = field(default_factory=dict)

    def to_document(self) -> dict[str, Any]:
        sites: dict[str, dict[str, float]] = {}
        for name, s in self.sites.items():
            sites[name] = {"pue": s.pue, "carbon_intensity": s.carbon_intensity, "wue": s.wue, "renewable_share": s.renewable_share}
            if math.isnan(s.carbon_intensity):  # not given: left out, as it came
                del sites[name]["carbon_intensity"]
        return {"sites": sites, "nodes": [n.to_document() for n in self.nodes]}


def linear_curve(idle_watts: float, watts_per_core: float, cores: float) -> tuple[float, ...]:
    """The 11-point curve of the linear model P(u) = idle + watts_per_core × cores × u."""
    return tuple(float(idle_watts + watts_per_core * cores * i / (CURVE_POINTS - 1)) for i in range(CURVE_POINTS))


def parse_sites(doc: Any, check: Checker, path: str = "sites") -> dict[str, Site]:
    sites: dict[str, Site] = {}
    for name, body in check.mapping(doc, path).items():
        where = f"{path}.{name}"
        body = check.mapping(body, where)
        check.unknown_keys(body, SITE_FIELDS, where)
        pue = check.number(body, "pue", where, default=DEFAULT_PUE, minimum=1.0)
        ci = check.number(body, "carbon_intensity", where, default=DEFAULT_CARBON_INTENSITY, minimum=0.0)
        wue = check.number(body, "wue", where, default=0.0, minimum=0.0)
        share = check.number(body, "renewable_share", where, default=0.0, minimum=0.0, maximum=1.0)
        if None not in (pue, ci, wue, share):
            sites[str(name)] = Site(str(name), pue, ci, wue, share)  # type: ignore[arg-type]
    return sites


def parse_profiles(doc: Any, where: str) -> ProfileSet:
    """Parse and validate a profile document; raise ``ConfigError`` listing every problem."""
    check = Checker(where)
    root = check.mapping(doc, "")
    check.unknown_keys(root, ("sites", "nodes"), "")
    sites = parse_sites(root.get("sites"), check)
    nodes: list[NodeProfile] = []
    seen: set[str] = set()
    for i, item in enumerate(check.list_of(root, "nodes", "")):
        raw_name = item.get("name") if isinstance(item, Mapping) else None
        if isinstance(raw_name, str) and raw_name in seen:
            check.problem(f"nodes[{i}].name", f"duplicate node name {raw_name!r}")
            continue
        if isinstance(raw_name, str):
            seen.add(raw_name)
        node = _parse_node(item, f"nodes[{i}]", sites, check)
        if node is not None:
            nodes.append(node)
    check.raise_if_any()
    return ProfileSet(tuple(nodes), sites)


def _parse_node(item: Any, path: str, sites: Mapping[str, Site], check: Checker) -> NodeProfile | None:
    before = len(check.problems)
    body = check.mapping(item, path)
    if not body:
        if not check.problems[before:]:
            check.problem(path, "must be a mapping with at least name, cores and a power model")
        return None
    check.unknown_keys(body, NODE_FIELDS, path)
    name = check.string(body, "name", path)
    cores = check.number(body, "cores", path, exclusive_minimum=0.0)
    site_name = check.string(body, "site", path, default="")
    site = Site("")
    if site_name:
        if site_name in sites:
            site = sites[site_name]
        else:
            check.problem(f"{path}.site", f"unknown site {site_name!r} (defined: {', '.join(sorted(sites)) or 'none'})")
    # The curve key decides the model: a curve that is given but wrong is its own problem, and
    # the linear model's keys are then not asked for as well.
    curve_given = body.get("power_curve_watts") is not None
    curve = check.numbers(body, "power_curve_watts", path, length=CURVE_POINTS, minimum=0.0)
    if curve_given:
        if "idle_watts" in body or "watts_per_core" in body:
            check.problem(path, "give either power_curve_watts or idle_watts + watts_per_core, not both")
        elif curve is not None and any(b < a for a, b in pairwise(curve)):
            check.problem(f"{path}.power_curve_watts", "must not decrease with load")
    else:
        idle = check.number(body, "idle_watts", path, minimum=0.0)
        per_core = check.number(body, "watts_per_core", path, minimum=0.0)
        if idle is not None and per_core is not None and cores is not None:
            curve = list(linear_curve(idle, per_core, cores))
    memory = check.number(body, "memory_bytes", path, default=0.0, minimum=0.0)
    speed = check.number(body, "speed", path, default=1.0, exclusive_minimum=0.0)
    util = check.number(body, "utilisation", path, default=0.0, minimum=0.0, maximum=1.0)
    measured = check.number(body, "measured_watts", path, default=None, minimum=0.0)
    cap = check.number(body, "power_cap_watts", path, default=None, exclusive_minimum=0.0)
    updated = check.number(body, "updated", path, default=None, minimum=0.0)
    pue = check.number(body, "pue", path, default=site.pue, minimum=1.0)
    ci = check.number(body, "carbon_intensity", path, default=site.carbon_intensity, minimum=0.0)
    server_id = check.string(body, "server_id", path, default="")
    idle_power = check.string(body, "idle_power", path, default="", choices=IDLE_POWER_CLASSES)
    held_until = check.number(body, "held_until", path, default=None, minimum=0.0)
    sources = _parse_sources(body.get("sources"), f"{path}.sources", check)
    gpus = _parse_gpus(body.get("gpus"), f"{path}.gpus", check)
    if len(check.problems) > before:
        return None
    assert name is not None and cores is not None and curve is not None
    return NodeProfile(
        name=name,
        cores=cores,
        power_curve_watts=tuple(curve),
        site=site_name or "",
        memory_bytes=memory or 0.0,
        speed=speed or 1.0,
        utilisation=util or 0.0,
        measured_watts=measured,
        power_cap_watts=cap,
        updated=updated,
        gpus=gpus,
        pue=pue if pue is not None else DEFAULT_PUE,
        carbon_intensity=ci if ci is not None else DEFAULT_CARBON_INTENSITY,
        sources=sources,
        server_id=server_id or "",
        idle_power=idle_power or "",
        held_until=held_until,
    )


def _parse_sources(value: Any, path: str, check: Checker) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        check.problem(path, "must be a list of source names")
        return ()
    return tuple(value)


def _parse_gpus(value: Any, path: str, check: Checker) -> GpuProfile | None:
    if value is None:
        return None
    body = check.mapping(value, path)
    if not body:
        return None
    check.unknown_keys(body, GPU_FIELDS, path)
    count = check.number(body, "count", path, minimum=0.0)
    idle = check.number(body, "idle_watts", path, minimum=0.0)
    peak = check.number(body, "max_watts", path, minimum=0.0)  # 0 before the agent has read any GPU power
    speed = check.number(body, "speed", path, default=1.0, exclusive_minimum=0.0)
    util = check.number(body, "utilisation", path, default=0.0, minimum=0.0, maximum=1.0)
    model = check.string(body, "model", path, default="")
    if count is not None and count != int(count):
        check.problem(f"{path}.count", f"must be a whole number, got {count:g}")
        return None
    if idle is not None and peak is not None and peak < idle:
        check.problem(f"{path}.max_watts", f"must be >= idle_watts ({idle:g}), got {peak:g}")
        return None
    if None in (count, idle, peak, speed, util):
        return None
    return GpuProfile(int(count), idle, peak, speed, util, model or "")  # type: ignore[arg-type]


# Columns of NodeArrays.table, one row per node: selecting candidates is one fancy index.
COLUMNS = (
    "cores",
    "utilisation",
    "speed",
    "pue",
    "carbon_intensity",
    "measured_watts",
    "power_cap_watts",
    "updated",
    "gpu_count",
    "gpu_idle_watts",
    "gpu_max_watts",
    "gpu_speed",
    "gpu_utilisation",
    "idle_avoidable",  # 1: autoscaled or power-managed, 0: always-on, NaN: the policy's default
    "held_until",  # NaN: unknown
)
COL = {name: i for i, name in enumerate(COLUMNS)}


@dataclass(frozen=True)
class NodeArrays:
    """Struct-of-arrays view of a profile set, built once per refresh, read per request.

    Row ``i`` describes ``names[i]``; ``index`` maps a node name to its row. ``table`` holds
    every per-node number (columns in ``COLUMNS``; NaN where a profile has no measurement,
    cap or timestamp) and ``curve`` the 11-point power curves; the named attributes are
    read-only views of the table's columns, each made once per set (the same object every
    time it is asked for).
    """

    names: tuple[str, ...]
    index: Mapping[str, int]
    curve: np.ndarray  # (n, 11) watts
    table: np.ndarray  # (n, len(COLUMNS))

    @classmethod
    def build(cls, profiles: Sequence[NodeProfile]) -> NodeArrays:
        def nan(v: float | None) -> float:
            return np.nan if v is None else float(v)

        rows = []
        for p in profiles:
            g = p.gpus
            rows.append(
                (
                    p.cores,
                    p.utilisation,
                    p.speed,
                    p.pue,
                    p.carbon_intensity,
                    nan(p.measured_watts),
                    nan(p.power_cap_watts),
                    nan(p.updated),
                    g.count if g else 0.0,
                    g.idle_watts if g else 0.0,
                    g.max_watts if g else 0.0,
                    g.speed if g else 1.0,
                    g.utilisation if g else 0.0,
                    (1.0 if p.idle_power in AVOIDABLE_IDLE else 0.0) if p.idle_power else np.nan,
                    nan(p.held_until),
                )
            )
        n = len(profiles)
        table = np.array(rows, dtype=np.float64).reshape(n, len(COLUMNS))
        curve = np.array([p.power_curve_watts for p in profiles], dtype=np.float64).reshape(n, CURVE_POINTS)
        table.setflags(write=False)
        curve.setflags(write=False)
        return cls(tuple(p.name for p in profiles), {p.name: i for i, p in enumerate(profiles)}, curve, table)

    def __len__(self) -> int:
        return len(self.names)

    def column(self, name: str) -> np.ndarray:
        return self.table[:, COL[name]]

    def with_columns(self, **columns: np.ndarray | float) -> NodeArrays:
        """A copy with some columns replaced (e.g. live utilisation in the simulator)."""
        table = self.table.copy()
        for name, values in columns.items():
            table[:, COL[name]] = values
        table.setflags(write=False)
        return NodeArrays(self.names, self.index, self.curve, table)

    @cached_property
    def cores(self) -> np.ndarray:
        return self.column("cores")

    @cached_property
    def utilisation(self) -> np.ndarray:
        return self.column("utilisation")

    @cached_property
    def speed(self) -> np.ndarray:
        return self.column("speed")

    @cached_property
    def pue(self) -> np.ndarray:
        return self.column("pue")

    @cached_property
    def carbon_intensity(self) -> np.ndarray:
        return self.column("carbon_intensity")

    @cached_property
    def measured_watts(self) -> np.ndarray:
        return self.column("measured_watts")

    @cached_property
    def power_cap_watts(self) -> np.ndarray:
        return self.column("power_cap_watts")

    @cached_property
    def updated(self) -> np.ndarray:
        return self.column("updated")

    @cached_property
    def gpu_count(self) -> np.ndarray:
        return self.column("gpu_count")

    @cached_property
    def gpu_idle_watts(self) -> np.ndarray:
        return self.column("gpu_idle_watts")

    @cached_property
    def gpu_max_watts(self) -> np.ndarray:
        return self.column("gpu_max_watts")

    @cached_property
    def gpu_speed(self) -> np.ndarray:
        return self.column("gpu_speed")

    @cached_property
    def gpu_utilisation(self) -> np.ndarray:
        return self.column("gpu_utilisation")

    @cached_property
    def idle_avoidable(self) -> np.ndarray:
        return self.column("idle_avoidable")

    @cached_property
    def held_until(self) -> np.ndarray:
        return self.column("held_until")

    # Facts about the whole set that every evaluation asks, worked out once per set (the
    # arrays are read-only, so they cannot go stale).

    @cached_property
    def any_gpus(self) -> bool:
        """Whether some node has GPUs (every row's GPU columns are 0 otherwise)."""
        return bool((self.gpu_count > 0).any())

    @cached_property
    def idle_classes(self) -> tuple[bool, bool]:
        """(some profile says its idle power can be avoided, some profile does not say: NaN)."""
        column = self.idle_avoidable
        unset = np.isnan(column)
        return bool(column[~unset].any()), bool(unset.any())
