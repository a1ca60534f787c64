"""The indicators of ``joulesched report``: every pod's energy, CO2e, water and SCI per step
(with :mod:`policy.impact`), grouped into the report's rows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from joulesched.impact.query import Fetched, FloatArray, Scope, iso
from joulesched.policy import impact
from joulesched.policy.impact import Totals

BY_CHOICES = ("pod", "namespace", "owner", "run", "process", "node")
NONE = "<none>"

# -- the maths (policy.impact), per pod and step -----------------------------------------------------


@dataclass(frozen=True)
class PodImpact:
    key: tuple[str, str, str, str]  # node, namespace, pod, idle_policy
    indicators: impact.Indicators


def _node_lookup(data: Fetched) -> tuple[dict[str, list[str | None]], dict[str, list[str | None]]]:
    """Per node and step, its site and its server (None when absent or ambiguous)."""
    count = len(data.steps)
    site: dict[str, list[set[str]]] = {}
    server: dict[str, list[set[str]]] = {}
    for (node, s, srv), present in data.node_info.items():
        site.setdefault(node, [set() for _ in range(count)])
        server.setdefault(node, [set() for _ in range(count)])
        for k in np.flatnonzero(np.isfinite(present)):
            site[node][k].add(s)
            server[node][k].add(srv)

    def one(sets: list[set[str]]) -> list[str | None]:
        return [next(iter(x)) if len(x) == 1 else None for x in sets]

    return {k: one(v) for k, v in site.items()}, {k: one(v) for k, v in server.items()}


def compute(data: Fetched) -> list[PodImpact]:
    """Every indicator of every pod and step, with :func:`policy.impact.indicators`."""
    count = len(data.steps)
    nan = np.full(count, np.nan)
    site_of, server_of = _node_lookup(data)
    out: list[PodImpact] = []
    for key, energy in sorted(data.pods.items()):
        node = key[0]
        sites = site_of.get(node, [None] * count)
        servers = server_of.get(node, [None] * count)

        def factor(name: str, sites: list[str | None] = sites) -> FloatArray:
            table = data.factors.get(name, {})
            return np.array([table.get(s, nan)[k] if s is not None else np.nan for k, s in enumerate(sites)])

        rate = np.array(
            [
                data.embodied.get(srv, nan)[k] / data.lifetime.get(srv, nan)[k] if srv is not None else np.nan
                for k, srv in enumerate(servers)
            ]
        )
        share = impact.energy_share(energy, data.nodes.get(node, nan))
        out.append(
            PodImpact(
                key,
                impact.indicators(
                    energy,
                    seconds=data.step,
                    pue=factor("pue"),
                    intensity=factor("intensity"),
                    wue=factor("wue"),
                    renewable_share=factor("renewable_share"),
                    embodied_grams_per_second=rate,
                    share=share,
                ),
            )
        )
    return out


def group_key(by: str, pod: PodImpact, data: Fetched) -> tuple[str, ...]:
    node, namespace, name, _ = pod.key
    if by == "pod":
        return (namespace, name)
    if by == "namespace":
        return (namespace,)
    if by == "node":
        return (node,)
    if by == "owner":
        return (namespace, data.owners.get((namespace, name), NONE))
    run, process = data.runs.get((namespace, name), (NONE, NONE))
    return (namespace, run) if by == "run" else (namespace, run, process)


GROUP_COLUMNS = {
    "pod": ("namespace", "pod"),
    "namespace": ("namespace",),
    "node": ("node",),
    "owner": ("namespace", "owner"),
    "run": ("namespace", "run"),
    "process": ("namespace", "run", "process"),
}


@dataclass(frozen=True)
class Report:
    scope: Scope
    start: float
    end: float  # the end of the last whole step
    step: float
    by: str
    rows: list[tuple[tuple[str, ...], int, Totals]]  # group, pods, totals
    total: Totals
    pods: int
    idle_policies: tuple[str, ...]
    per: str
    units: float
    series: dict[tuple[str, ...], tuple[FloatArray, FloatArray]]  # group -> (IT joules, CO2e grams) per step
    steps: FloatArray
    notes: tuple[str, ...] = ()  # what the input could not give (gaps), and the policies it used

    def to_json(self) -> dict[str, Any]:
        def totals(t: Totals, pods: int) -> dict[str, Any]:
            return {
                "pods": pods,
                "it_kwh": t.it_kwh,
                "facility_kwh": t.facility_kwh,
                "operational_gco2e": t.operational_grams,
                "embodied_gco2e": t.embodied_grams,
                "total_gco2e": t.carbon_grams,
                "water_litres": t.water_litres,
                "renewable_kwh": t.renewable_kwh,
                f"sci_gco2e_per_{self.per}": _finite(t.sci(self.units)),
                "intervals_without_site_factors": t.missing_site,
                "intervals_without_embodied": t.missing_embodied,
            }

        columns = GROUP_COLUMNS[self.by]
        return {
            "scope": self.scope.describe(),
            "start": iso(self.start),
            "end": iso(self.end),
            "step_seconds": self.step,
            "by": self.by,
            "idle_policies": list(self.idle_policies),
            "sci": {"per": self.per, "functional_units": self.units},
            "rows": [{**dict(zip(columns, group, strict=True)), **totals(t, pods)} for group, pods, t in self.rows],
            "total": totals(self.total, self.pods),
            "notes": list(self.notes),
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def build_report(
    data: Fetched, scope: Scope, start: float, by: str, per: str, units: float, notes: tuple[str, ...] = ()
) -> Report:
    pods = compute(data)
    groups: dict[tuple[str, ...], list[PodImpact]] = {}
    for pod in pods:
        groups.setdefault(group_key(by, pod, data), []).append(pod)
    rows: list[tuple[tuple[str, ...], int, Totals]] = []
    series: dict[tuple[str, ...], tuple[FloatArray, FloatArray]] = {}
    for group in sorted(groups):
        members = groups[group]
        total = impact.ZERO
        energy = np.zeros(len(data.steps))
        carbon = np.zeros(len(data.steps))
        for pod in members:
            total = total + pod.indicators.total()
            energy += np.nan_to_num(pod.indicators.it_joules)
            carbon += np.nan_to_num(pod.indicators.operational_grams) + np.nan_to_num(pod.indicators.embodied_grams)
        rows.append((group, len({(p.key[1], p.key[2]) for p in members}), total))
        series[group] = (energy, carbon)
    grand = impact.ZERO
    for _, _, t in rows:
        grand = grand + t
    return Report(
        scope,
        start,
        float(data.steps[-1]),
        data.step,
        by,
        rows,
        grand,
        len({(p.key[1], p.key[2]) for p in pods}),
        tuple(sorted({p.key[3] for p in pods})),
        per,
        units,
        series,
        data.steps,
        notes,
    )
