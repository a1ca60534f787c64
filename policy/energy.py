"""Exact energy arithmetic: wrap-safe counter deltas, trapezoid integration, and the node total.

Pure functions over numbers (no files, no clocks), shared by the agent's sampler, the windows API,
``joulesched measure`` and the simulator.

Which reading is the node's total (the *basis*), from most to least complete::

    1. a whole-server reading (domain "platform": IPMI DCMI/SDR, Redfish), plus the GPUs when
       the server reading excludes them (``server_includes_gpus: false``)
    2. RAPL psys (the SoC platform on client parts) plus the GPUs
    3. RAPL package + DRAM plus the GPUs
    4. the GPUs alone

RAPL still splits the node's energy into ``cpu`` (packages) and ``dram`` under a server reading;
``other`` is what the server reading has beyond them (fans, disks, NICs, PSU losses). The domains
always add up to the node total. A zone with a ``parent`` is part of that parent and never added.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

NANO = 1_000_000_000  # totals are kept as integer nanojoules: exact, and never overflow (Python int)
NODE_DOMAINS = ("cpu", "dram", "gpu", "other")

ZoneKey = tuple[str, str]  # (source, zone)


@dataclass(frozen=True, slots=True)
class Delta:
    """Energy of one zone between two readings, or why it was dropped."""

    joules: float | None
    anomaly: str | None = None  # negative | implausible | gap | garbage | reset


def counter_delta(
    prev: float, cur: float, max_joules: float | None, dt: float, max_watts: float, *, wrap_watts: float | None = None
) -> Delta:
    """Energy between two counter readings, correcting one wrap at ``max_joules``.

    Dropped (``joules=None``):

    * ``garbage``: a reading outside the counter's range (below 0, above ``max_joules``);
    * ``negative``: a delta still negative after the wrap correction (a counter reset, or a
      counter without a known range going back);
    * ``implausible``: a delta above ``max_watts × dt`` (physically impossible: a spurious wrap,
      a garbage read);
    * ``reset``: a step back that a wrap would explain only with more than ``wrap_watts × dt``
      (the zone's own plausible power over the real elapsed time): the counter was reset, or
      went back, rather than wrapped, and the energy since then is unknown, never invented;
    * ``gap``: readings so far apart that the counter could have wrapped more than once at
      ``wrap_watts`` (``wrap_watts × dt ≥ max_joules``): how many times is unknown.

    ``dt`` is the real time the energy accrued over: for the meter, the time since the counter
    last changed, so that a coarse counter's step read soon after the step is not dropped.
    """
    if impossible(cur, max_joules):
        return Delta(None, "garbage")
    delta = cur - prev
    wrapped = False
    if delta < 0 and max_joules:
        delta += max_joules
        wrapped = True
    if delta < 0:
        return Delta(None, "negative")
    if dt <= 0:
        return Delta(0.0) if delta == 0 else Delta(None, "implausible")
    if max_joules and wrap_watts is not None and wrap_watts * dt >= max_joules:
        return Delta(None, "gap")
    if wrapped and wrap_watts is not None and delta > min(wrap_watts, max_watts) * dt:
        return Delta(None, "reset")
    if delta > max_watts * dt:
        return Delta(None, "implausible")
    return Delta(delta)


def impossible(value: float, limit: float | None) -> bool:
    """A reading no device gives: not a number, infinite, negative, or over ``limit`` (a
    counter's range, a power zone's ceiling; None or 0: no limit)."""
    return not (math.isfinite(value) and 0 <= value <= (limit or math.inf))


def trapezoid(
    prev_watts: float, prev_t: float, cur_watts: float, cur_t: float, max_watts: float, max_gap: float
) -> Delta:
    """Energy between two power readings, integrated with their own timestamps.

    A reading no device can give (negative, over ``max_watts``, not a number: a BMC's 0xFFFF
    while it resets) is ``garbage``: the caller keeps the last good reading and integrates
    from it to the next, never from the bad one. ``negative`` is time going back; ``gap`` two
    readings too far apart to integrate between.
    """
    if impossible(cur_watts, max_watts):
        return Delta(None, "garbage")
    dt = cur_t - prev_t
    if dt < 0:
        return Delta(None, "negative")
    if dt == 0:
        return Delta(0.0)
    if dt > max_gap:
        return Delta(None, "gap")
    return Delta((prev_watts + cur_watts) / 2.0 * dt)


def to_nanojoules(joules: float) -> int:
    return round(joules * NANO)


@dataclass(frozen=True, slots=True)
class ZoneInfo:
    source: str
    zone: str
    domain: str
    kind: str
    parent: str | None
    max_joules: float | None


@dataclass(frozen=True)
class Layout:
    """Which source plays which role: decided from the zones present, not from one interval's
    reads, so that the basis does not flip when one read fails (the next read catches up)."""

    platform: str | None = None
    platform_others: tuple[str, ...] = ()  # further whole-server sources: cross-checked only
    rapl: str | None = None  # the source of package/dram (and psys) zones
    psys: str | None = None
    gpu: str | None = None
    server_includes_gpus: bool = False
    zones: Mapping[ZoneKey, ZoneInfo] = field(default_factory=dict)

    def covering(self, keys: Collection[ZoneKey]) -> Layout:
        """The roles over the zones in ``keys`` only (a window's zones read at both edges): a
        role whose source has none of them goes, the platform to the next whole-server source
        that has (a BMC that opened within a window has no energy for it)."""
        sources = {key[0] for key in keys}
        roles = (self.platform, *self.platform_others, self.rapl, self.psys, self.gpu)
        if all(s in sources for s in roles if s):
            return self
        platforms = [s for s in (self.platform, *self.platform_others) if s and s in sources]
        return replace(
            self,
            platform=platforms[0] if platforms else None,
            platform_others=tuple(platforms[1:]),
            rapl=self.rapl if self.rapl in sources else None,
            psys=self.psys if self.psys in sources else None,
            gpu=self.gpu if self.gpu in sources else None,
            zones={k: z for k, z in self.zones.items() if k[0] in sources},
        )

    @property
    def basis(self) -> str:
        parts: list[str] = []
        if self.platform:
            parts.append(self.platform)
            if self.gpu and not self.server_includes_gpus:
                parts.append(self.gpu)
        elif self.psys or self.rapl:
            parts.append(self.psys or self.rapl or "")
            if self.gpu:
                parts.append(self.gpu)
        elif self.gpu:
            parts.append(self.gpu)
        return "+".join(dict.fromkeys(parts))

    @property
    def domains(self) -> tuple[str, ...]:
        """The domains this layout can give energy to (the others stay 0 and are not exported)."""
        present = []
        if self.rapl or self.platform:
            present += ["cpu", "dram"]
        if self.gpu:
            present.append("gpu")
        if self.platform or self.psys:
            present.append("other")
        return tuple(present)

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s for s in (self.platform, self.rapl, self.psys, self.gpu) if s))


def plan_layout(zones: Sequence[ZoneInfo], order: Sequence[str], server_includes_gpus: bool) -> Layout:
    """Assign roles to sources: the first source in ``order`` with a zone of the domain wins."""
    by_source: dict[str, set[str]] = {}
    for z in zones:
        if z.parent is None:
            by_source.setdefault(z.source, set()).add(z.domain)
    ranked = [s for s in order if s in by_source] + sorted(s for s in by_source if s not in order)

    def first(domain: str) -> str | None:
        return next((s for s in ranked if domain in by_source[s]), None)

    platforms = [s for s in ranked if "platform" in by_source[s]]
    return Layout(
        platform=platforms[0] if platforms else None,
        platform_others=tuple(platforms[1:]),
        rapl=first("package"),
        psys=first("psys"),
        gpu=first("gpu"),
        server_includes_gpus=server_includes_gpus,
        zones={(z.source, z.zone): z for z in zones},
    )


@dataclass(frozen=True)
class NodeSplit:
    basis: str
    node_joules: float
    domains: Mapping[str, float]  # cpu, dram, gpu, other: they sum to node_joules
    gpu_zones: Mapping[str, float]  # gpu zone -> joules, scaled like domains["gpu"]
    rapl_joules: float | None  # package + dram from RAPL (cross-check)
    platform_joules: Mapping[str, float]  # per whole-server source (cross-check)
    # per part zone, what was scaled away to fit inside the server or psys reading (see split_node)
    unfitted: Mapping[ZoneKey, float] = field(default_factory=dict)


def _sum(layout: Layout, deltas: Mapping[ZoneKey, float], source: str | None, domain: str) -> float:
    if source is None:
        return 0.0
    return sum(
        j
        for key, j in deltas.items()
        if key[0] == source and (z := layout.zones.get(key)) and z.domain == domain and z.parent is None
    )


def _fit(base: float, parts: float) -> float:
    """The factor that scales ``parts`` to fit inside ``base`` (1 when they fit)."""
    return base / parts if parts > base and parts > 0 else 1.0


def split_node(
    layout: Layout, deltas: Mapping[ZoneKey, float], owed: Mapping[ZoneKey, float] | None = None
) -> NodeSplit:
    """The node's energy and its domains from per-zone energies over one interval or window.

    The parts (RAPL packages and DRAM, and the GPUs when the server reading includes them) are
    scaled to fit inside a server or psys reading they exceed; what that scales away is
    ``unfitted``, per zone. ``owed``: parts' energy of earlier intervals that did not fit (a
    server reading that lags: a BMC refreshing slower than the interval, a failed read caught up
    later), added to this interval's parts; the cross-check (``rapl_joules``) stays this
    interval's reading.
    """
    joules = deltas
    if owed and (layout.platform or layout.psys):
        joules = dict(deltas)
        for key, j in owed.items():
            joules[key] = joules.get(key, 0.0) + j
    cpu = _sum(layout, joules, layout.rapl, "package")
    dram = _sum(layout, joules, layout.rapl, "dram")
    gpu_zones = {
        key[1]: j
        for key, j in joules.items()
        if key[0] == layout.gpu and (z := layout.zones.get(key)) and z.domain == "gpu" and z.parent is None
    }
    gpu = sum(gpu_zones.values())
    platform = {s: _sum(layout, deltas, s, "platform") for s in (layout.platform, *layout.platform_others) if s}
    if not layout.rapl:
        rapl = None
    elif joules is deltas:
        rapl = cpu + dram
    else:
        rapl = _sum(layout, deltas, layout.rapl, "package") + _sum(layout, deltas, layout.rapl, "dram")
    scale = 1.0
    gpu_in_fit = False
    if layout.platform:
        base = platform[layout.platform]
        gpu_in_fit = layout.server_includes_gpus
        scale = _fit(base, cpu + dram + (gpu if gpu_in_fit else 0.0))
        cpu, dram = cpu * scale, dram * scale
        if gpu_in_fit:
            gpu *= scale
            node = base
            other = base - cpu - dram - gpu
        else:
            node = base + gpu
            other = base - cpu - dram
    elif layout.psys:
        base = _sum(layout, deltas, layout.psys, "psys")
        scale = _fit(base, cpu + dram)
        cpu, dram = cpu * scale, dram * scale
        node = base + gpu
        other = base - cpu - dram
    else:
        node = cpu + dram + gpu
        other = 0.0
    gpu_scale = scale if gpu_in_fit else 1.0
    gpu_scaled = {name: j * gpu_scale for name, j in gpu_zones.items()}
    domains = {"cpu": cpu, "dram": dram, "gpu": gpu, "other": max(other, 0.0)}
    unfitted: dict[ZoneKey, float] = {}
    if scale < 1.0:
        for key, j in joules.items():
            z = layout.zones.get(key)
            if z is None or z.parent is not None or j <= 0:
                continue
            if (key[0] == layout.rapl and z.domain in ("package", "dram")) or (
                gpu_in_fit and key[0] == layout.gpu and z.domain == "gpu"
            ):
                unfitted[key] = j * (1.0 - scale)
    return NodeSplit(layout.basis, node, domains, gpu_scaled, rapl, platform, unfitted)


__all__ = [
    "NANO",
    "NODE_DOMAINS",
    "Delta",
    "Layout",
    "NodeSplit",
    "ZoneInfo",
    "counter_delta",
    "impossible",
    "plan_layout",
    "split_node",
    "to_nanojoules",
    "trapezoid",
]
