"""``joulesched report``: the environmental impact of a namespace, a label selector, a controller
or a Nextflow run over a time range, from Prometheus.

::

    joulesched report --prometheus URL
        (--namespace NS | --selector SEL | --run NAME | --owner KIND/NAME)   # NS may narrow the others
        (--start T --end T | --last DURATION)   # T: ISO 8601 (UTC if naive), unix seconds, now, now-2h
        [--step 60s] [--by pod|namespace|owner|run|process|node]
        [--per hour|run|request] [--requests N | --requests-query PROMQL]
        [--format table|csv|json] [--output FILE] [--chart FILE.png]

The range is cut into steps (60 s by default: the recording rules' minute); for every step it
reads from Prometheus each pod's energy increment (``increase()`` of
``joulesched_pod_energy_joules_total`` over the step), its node's energy increment, the node's
site and server (``joulesched_node_info``), the site factors (their mean over the step) and the
server's embodied emissions, then computes every indicator with :mod:`policy.impact` — the same
formulas as ``deploy/prometheus/rules.yaml``, so with a 60 s step the report's totals equal the
sum of the recorded rules over the same range (the tests hold them equal on a real Prometheus).

Pods are chosen through kube-state-metrics: a selector (``app=web,tier!=db``,
``env in (a,b)``, ``!canary``) is matched on ``kube_pod_labels`` (its labels must be
allow-listed), a run on the ``nextflow.io/runName`` label Nextflow puts on its task pods, an
owner on ``kube_pod_owner`` (a Deployment through its ReplicaSets). A pod counts when it
matched at any time in the range.

SCI is ``(operational + embodied) / R`` with R the scope's functional units: the hours of the
range, the Nextflow runs among its pods, or a number of requests (given, or a PromQL query whose
``{range}`` is replaced by the range, e.g. ``sum(increase(http_requests_total[{range}]))``).
Each row shows its part of the scope's SCI, so the rows add up to the total.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from joulesched.contracts import names as n
from joulesched.impact.errors import ReportError
from joulesched.policy import impact
from joulesched.policy.impact import Totals

MAX_POINTS = 10_000  # Prometheus refuses more than 11,000 points per series in one range query
BY_CHOICES = ("pod", "namespace", "owner", "run", "process", "node")
KSM_RUN = "label_nextflow_io_run_name"
KSM_PROCESS = "label_nextflow_io_process_name"
NONE = "<none>"

FloatArray = np.ndarray


# -- arguments -----------------------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """Seconds from ``90s``, ``5m``, ``1h30m``, ``2d`` or a plain number of seconds."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        parts = _DURATION.findall(text)
        if not parts or "".join(a + b for a, b in parts) != text:
            raise ReportError(f"{text!r} is not a duration (e.g. 90s, 5m, 1h30m, 2d)") from None
        value = sum(float(a) * _UNIT[b] for a, b in parts)
    if not value > 0 or not math.isfinite(value):
        raise ReportError(f"duration {text!r} must be > 0")
    return value


def parse_time(text: str, now: float) -> float:
    """Unix seconds from ISO 8601 (naive = UTC), unix seconds, ``now`` or ``now-2h``."""
    text = text.strip()
    if text == "now":
        return now
    if text.startswith("now-"):
        return now - parse_duration(text[4:])
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ReportError(
            f"{text!r} is not a time (ISO 8601 like 2022-06-01T00:00:00Z, unix seconds, now or now-2h)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


_LABEL_KEY = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_INVALID = re.compile(r"[^a-zA-Z0-9_]")
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")


def ksm_label(key: str) -> str:
    """The label kube-state-metrics gives a pod label: ``nextflow.io/runName`` → ``label_nextflow_io_run_name``."""
    return "label_" + _CAMEL.sub(r"\1_\2", _INVALID.sub("_", key)).lower()


def _quote(value: str) -> str:
    return json.dumps(value)  # a PromQL string literal: double quotes, backslash escapes


def _regex_escape(value: str) -> str:
    return re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", value)


def selector_matchers(selector: str) -> list[str]:
    """PromQL matchers on ``kube_pod_labels`` for a Kubernetes label selector."""
    matchers: list[str] = []
    for term in _split_selector(selector):
        term = term.strip()
        m = re.fullmatch(r"(\S+?)\s+(in|notin)\s+\(([^)]*)\)", term)
        if m:
            key, op, values = m.group(1), m.group(2), [v.strip() for v in m.group(3).split(",") if v.strip()]
            _check_key(key, selector)
            alternation = "|".join(_regex_escape(v) for v in values)
            matchers.append(f"{ksm_label(key)}{'=~' if op == 'in' else '!~'}{_quote(alternation)}")
            continue
        m = re.fullmatch(r"(\S+?)\s*(==|!=|=)\s*(\S*)", term)
        if m:
            key, op, value = m.group(1), m.group(2), m.group(3)
            _check_key(key, selector)
            matchers.append(f"{ksm_label(key)}{'!=' if op == '!=' else '='}{_quote(value)}")
            continue
        if term.startswith("!"):
            _check_key(term[1:], selector)
            matchers.append(f'{ksm_label(term[1:])}=""')
            continue
        _check_key(term, selector)
        matchers.append(f'{ksm_label(term)}!=""')
    if not matchers:
        raise ReportError(f"selector {selector!r} is empty")
    return matchers


def _split_selector(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    return [t for t in terms if t.strip()]


def _check_key(key: str, selector: str) -> None:
    if not _LABEL_KEY.match(key):
        raise ReportError(f"selector {selector!r}: {key!r} is not a label key")


# -- reading Prometheus ----------------------------------------------------------------------------


class Prometheus:
    """The few queries the report makes, through prometheus-api-client."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        self.url = url
        self._client = PrometheusConnect(url=url, disable_ssl=False, retry=Retry(total=1), timeout=timeout)

    def _call(self, what: str, fn: Callable[[], Any]) -> list[dict[str, Any]]:
        try:
            result = fn()
        except Exception as err:  # requests' and the client's errors alike
            raise ReportError(
                f"Prometheus at {self.url}: {what} failed: {err} — check --prometheus and that it is up"
            ) from err
        return list(result or [])

    def instant(self, query: str, at: float) -> list[dict[str, Any]]:
        return self._call(f"query {query!r}", lambda: self._client.custom_query(query, params={"time": f"{at:.3f}"}))

    def range(self, query: str, first: float, last: float, step: float) -> list[dict[str, Any]]:
        """Values at ``first``, ``first + step`` … ``last``; times keep their milliseconds (the
        client would round them to seconds), so steps can fall exactly on rule evaluations."""
        start, end = datetime.fromtimestamp(first, UTC), datetime.fromtimestamp(last, UTC)
        exact = {"start": f"{first:.3f}", "end": f"{last:.3f}"}
        return self._call(
            f"query_range {query!r}",
            lambda: self._client.custom_query_range(query, start, end, f"{step:g}s", params=exact),
        )


@dataclass(frozen=True)
class Scope:
    namespace: str = ""
    selector: str = ""
    run: str = ""
    owner: str = ""  # Kind/name

    def describe(self) -> str:
        parts = [f"namespace {self.namespace}"] if self.namespace else []
        if self.selector:
            parts.append(f"selector {self.selector}")
        if self.run:
            parts.append(f"Nextflow run {self.run}")
        if self.owner:
            parts.append(f"owner {self.owner}")
        return ", ".join(parts)


@dataclass
class Fetched:
    """Everything read from Prometheus, as arrays over the steps (NaN where a series is absent)."""

    steps: FloatArray  # the end of each step, unix seconds
    step: float
    pods: dict[tuple[str, str, str, str], FloatArray]  # (node, namespace, pod, idle_policy) -> joules
    nodes: dict[str, FloatArray]  # node -> joules
    node_info: dict[tuple[str, str, str], FloatArray]  # (node, site, server_id) -> 1 where present
    factors: dict[str, dict[str, FloatArray]]  # factor -> site -> value
    embodied: dict[str, FloatArray]  # server_id -> grams
    lifetime: dict[str, FloatArray]  # server_id -> seconds (> 0)
    owners: dict[tuple[str, str], str] = field(default_factory=dict)  # (namespace, pod) -> Kind/name
    runs: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # (namespace, pod) -> (run, process)


FACTORS = {"pue": n.SITE_PUE, "intensity": n.SITE_CARBON, "wue": n.SITE_WUE, "renewable_share": n.SITE_RENEWABLE}


def _matrix(
    result: Iterable[Mapping[str, Any]], keys: Sequence[str], steps: FloatArray, step: float
) -> dict[tuple[str, ...], FloatArray]:
    out: dict[tuple[str, ...], FloatArray] = {}
    for series in result:
        labels = series.get("metric", {})
        key = tuple(str(labels.get(k, "")) for k in keys)
        row = out.setdefault(key, np.full(len(steps), np.nan))
        for ts, value in series.get("values", []):
            k = round((float(ts) - float(steps[0])) / step)
            if 0 <= k < len(steps):
                row[k] = float(value)
    return out


def _alternation(values: Iterable[str]) -> str:
    return "|".join(_regex_escape(v) for v in sorted(set(values)))


def _ns(row: Mapping[str, Any]) -> str:
    return str(row["metric"].get("namespace", ""))


def _pod(row: Mapping[str, Any]) -> str:
    return str(row["metric"].get("pod", ""))


def resolve_pods(
    prom: Prometheus, scope: Scope, start: float, end: float
) -> tuple[set[tuple[str, str]] | None, dict[tuple[str, str], tuple[str, str]], dict[tuple[str, str], str]]:
    """The (namespace, pod) pairs in scope (None: every pod of the namespace), with run and owner maps."""
    window = f"{max(1, round(end - start))}s"
    ns = [f"namespace={_quote(scope.namespace)}"] if scope.namespace else []
    pods: set[tuple[str, str]] | None = None

    def narrow(found: set[tuple[str, str]]) -> None:
        nonlocal pods
        pods = found if pods is None else pods & found

    if scope.selector:
        matchers = ", ".join([*ns, *selector_matchers(scope.selector)])
        rows = prom.instant(f"max by (namespace, pod) (max_over_time(kube_pod_labels{{{matchers}}}[{window}]))", end)
        narrow({(_ns(r), _pod(r)) for r in rows})
    if scope.run:
        matchers = ", ".join([*ns, f"{KSM_RUN}={_quote(scope.run)}"])
        rows = prom.instant(f"max by (namespace, pod) (max_over_time(kube_pod_labels{{{matchers}}}[{window}]))", end)
        narrow({(_ns(r), _pod(r)) for r in rows})
    if scope.owner:
        kind, _, name = scope.owner.partition("/")
        if not kind or not name:
            raise ReportError(f"--owner {scope.owner!r}: give KIND/NAME, e.g. Deployment/web")
        owners = [(kind, name)]
        if kind == "Deployment":  # pods belong to its ReplicaSets
            matchers = ", ".join([*ns, 'owner_kind="Deployment"', f"owner_name={_quote(name)}"])
            rows = prom.instant(
                f"max by (namespace, replicaset) (max_over_time(kube_replicaset_owner{{{matchers}}}[{window}]))", end
            )
            owners = [("ReplicaSet", r["metric"].get("replicaset", "")) for r in rows]
        found: set[tuple[str, str]] = set()
        if owners:
            matchers = ", ".join(
                [
                    *ns,
                    f"owner_kind={_quote(owners[0][0])}",
                    f"owner_name=~{_quote(_alternation(o for _, o in owners))}",
                    'owner_is_controller="true"',
                ]
            )
            rows = prom.instant(f"max by (namespace, pod) (max_over_time(kube_pod_owner{{{matchers}}}[{window}]))", end)
            found = {(_ns(r), _pod(r)) for r in rows}
        narrow(found)
    # run/process and owner of every pod in scope, for --by run|process|owner
    pod_ns = [*ns]
    if pods is not None:
        if not pods:
            return set(), {}, {}
        pod_ns = [
            f"namespace=~{_quote(_alternation(p[0] for p in pods))}",
            f"pod=~{_quote(_alternation(p[1] for p in pods))}",
        ]
    run_match = ", ".join([*pod_ns, f'{KSM_RUN}!=""'])
    run_rows = prom.instant(
        f"max by (namespace, pod, {KSM_RUN}, {KSM_PROCESS}) (max_over_time(kube_pod_labels{{{run_match}}}[{window}]))",
        end,
    )
    runs = {(_ns(r), _pod(r)): (r["metric"].get(KSM_RUN, ""), r["metric"].get(KSM_PROCESS, "")) for r in run_rows}
    owner_match = ", ".join([*pod_ns, 'owner_is_controller="true"'])
    owner_rows = prom.instant(
        f"max by (namespace, pod, owner_kind, owner_name) (max_over_time(kube_pod_owner{{{owner_match}}}[{window}]))",
        end,
    )
    owner_map = {
        (_ns(r), _pod(r)): f"{r['metric'].get('owner_kind', '')}/{r['metric'].get('owner_name', '')}"
        for r in owner_rows
    }
    return pods, runs, owner_map


def fetch(prom: Prometheus, scope: Scope, start: float, end: float, step: float) -> Fetched:
    """Read every series the indicators need for the steps ending at ``start + k·step`` (k ≥ 1)."""
    count = math.floor((end - start) / step + 1e-9)
    if count < 1:
        raise ReportError(f"the range ({end - start:g} s) is shorter than one step ({step:g} s)")
    steps = start + step * np.arange(1, count + 1, dtype=np.float64)
    pods, runs, owners = resolve_pods(prom, scope, start, end)
    window = f"{step:g}s"
    if pods is not None and not pods:
        raise ReportError(f"no pods match {scope.describe()} between {_iso(start)} and {_iso(end)}")
    if pods is None:
        matchers = f"namespace={_quote(scope.namespace)}"
    else:
        matchers = (
            f"namespace=~{_quote(_alternation(p[0] for p in pods))}, pod=~{_quote(_alternation(p[1] for p in pods))}"
        )

    def ranged(query: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for lo in range(0, count, MAX_POINTS):
            hi = min(lo + MAX_POINTS, count) - 1
            out.extend(prom.range(query, float(steps[lo]), float(steps[hi]), step))
        return out

    pod_keys = ("node", "namespace", "pod", "idle_policy")
    pod_rows = ranged(
        f"sum by (node, namespace, pod, idle_policy) (increase({n.POD_ENERGY.name}{{{matchers}}}[{window}]))"
    )
    pod_energy = _matrix(pod_rows, pod_keys, steps, step)
    if pods is not None:
        pod_energy = {k: v for k, v in pod_energy.items() if (k[1], k[2]) in pods}
    if not pod_energy:
        raise ReportError(
            f"no pod energy for {scope.describe()} between {_iso(start)} and {_iso(end)} (is the agent scraped?)"
        )
    nodes = sorted({k[0] for k in pod_energy})
    node_match = f"node=~{_quote(_alternation(nodes))}"
    node_energy = _matrix(
        ranged(f"sum by (node) (increase({n.NODE_DOMAIN_ENERGY.name}{{{node_match}}}[{window}]))"),
        ("node",),
        steps,
        step,
    )
    info = _matrix(
        ranged(f"max by (node, site, server_id) ({n.NODE_INFO.name}{{{node_match}}})"),
        ("node", "site", "server_id"),
        steps,
        step,
    )
    sites = sorted({k[1] for k in info})
    servers = sorted({k[2] for k in info})
    factors: dict[str, dict[str, FloatArray]] = {}
    for name, metric in FACTORS.items():
        rows = (
            ranged(f"max by (site) (avg_over_time({metric.name}{{site=~{_quote(_alternation(sites))}}}[{window}]))")
            if sites
            else []
        )
        factors[name] = {k[0]: v for k, v in _matrix(rows, ("site",), steps, step).items()}
    server_match = f"server_id=~{_quote(_alternation(servers))}"
    embodied: dict[str, FloatArray] = {}
    lifetime: dict[str, FloatArray] = {}
    if servers:
        embodied = {
            k[0]: v
            for k, v in _matrix(
                ranged(f"max by (server_id) ({n.SERVER_EMBODIED.name}{{{server_match}}})"), ("server_id",), steps, step
            ).items()
        }
        lifetime = {
            k[0]: v
            for k, v in _matrix(
                ranged(f"max by (server_id) ({n.SERVER_LIFETIME.name}{{{server_match}}} > 0)"),
                ("server_id",),
                steps,
                step,
            ).items()
        }
    return Fetched(
        steps,
        step,
        {(k[0], k[1], k[2], k[3]): v for k, v in pod_energy.items()},
        {k[0]: v for k, v in node_energy.items()},
        {(k[0], k[1], k[2]): v for k, v in info.items()},
        factors,
        embodied,
        lifetime,
        owners,
        runs,
    )


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
            "start": _iso(self.start),
            "end": _iso(self.end),
            "step_seconds": self.step,
            "by": self.by,
            "idle_policies": list(self.idle_policies),
            "sci": {"per": self.per, "functional_units": self.units},
            "rows": [{**dict(zip(columns, group, strict=True)), **totals(t, pods)} for group, pods, t in self.rows],
            "total": totals(self.total, self.pods),
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def build_report(data: Fetched, scope: Scope, start: float, by: str, per: str, units: float) -> Report:
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
    )


# -- output -------------------------------------------------------------------------------------

HEADER = ("pods", "IT kWh", "facility kWh", "op. gCO2e", "emb. gCO2e", "total gCO2e", "water L", "renew. kWh")


def _numbers(t: Totals, pods: int, report: Report) -> list[str]:
    sci = t.sci(report.units)
    return [
        str(pods),
        f"{t.it_kwh:.6f}",
        f"{t.facility_kwh:.6f}",
        f"{t.operational_grams:.4f}",
        f"{t.embodied_grams:.4f}",
        f"{t.carbon_grams:.4f}",
        f"{t.water_litres:.6f}",
        f"{t.renewable_kwh:.6f}",
        "–" if not math.isfinite(sci) else f"{sci:.4f}",
    ]


def render_table(report: Report) -> str:
    columns = GROUP_COLUMNS[report.by]
    header = [*columns, *HEADER, f"SCI g/{report.per}"]
    body = [[*group, *_numbers(t, pods, report)] for group, pods, t in report.rows]
    body.append(["TOTAL", *[""] * (len(columns) - 1), *_numbers(report.total, report.pods, report)])
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < len(columns) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    policies = ", ".join(report.idle_policies) or "unknown"
    out = [
        f"joulesched report: {report.scope.describe()}",
        f"range {_iso(report.start)} .. {_iso(report.end)} in {len(report.steps)} steps of {report.step:g} s; idle policy {policies}",
        f"SCI = (operational + embodied) / {report.units:g} {report.per}(s)",
        "",
        line(header),
        line(["-" * w for w in widths]),
        *[line(r) for r in body],
    ]
    notes = _notes(report)
    if notes:
        out += ["", *notes]
    return "\n".join(out) + "\n"


def _notes(report: Report) -> list[str]:
    notes = []
    t = report.total
    if t.missing_site:
        notes.append(
            f"note: {t.missing_site} pod-steps had energy but no site factors (node without joulesched_node_info or site gauges): "
            "their facility energy, operational CO2e, water and renewable energy are not counted"
        )
    if t.missing_embodied:
        notes.append(
            f"note: {t.missing_embodied} pod-steps had energy but no embodied figure (server without "
            f"{n.SERVER_EMBODIED.name}/{n.SERVER_LIFETIME.name}): their embodied CO2e is not counted"
        )
    if "bucket" in report.idle_policies:
        notes.append(
            "note: idle policy 'bucket': idle power is not in the pods' energy (see "
            f'{n.IDLE_ENERGY.name}{{bucket="idle"}}), nor the embodied emissions that follow it'
        )
    return notes


def render_csv(report: Report) -> str:
    buf = io.StringIO()
    doc = report.to_json()
    rows = [*doc["rows"], {**{c: "TOTAL" for c in GROUP_COLUMNS[report.by][:1]}, **doc["total"]}]
    writer = csv.DictWriter(buf, fieldnames=list(rows[0].keys()), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def render_chart(report: Report, path: str, top: int = 8) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [datetime.fromtimestamp(t, UTC) for t in report.steps]
    ranked = sorted(report.series, key=lambda g: -float(np.sum(report.series[g][1])))
    shown, rest = ranked[:top], ranked[top:]
    fig, (ax_power, ax_carbon) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for group in shown:
        energy, carbon = report.series[group]
        label = "/".join(group)
        ax_power.plot(times, energy / report.step, label=label)
        ax_carbon.plot(times, np.cumsum(carbon), label=label)
    if rest:
        energy = np.sum([report.series[g][0] for g in rest], axis=0)
        carbon = np.sum([report.series[g][1] for g in rest], axis=0)
        ax_power.plot(times, energy / report.step, label=f"{len(rest)} more", color="grey")
        ax_carbon.plot(times, np.cumsum(carbon), label=f"{len(rest)} more", color="grey")
    ax_power.set_ylabel("IT power (W)")
    ax_carbon.set_ylabel("cumulative CO2e (g)\noperational + embodied")
    ax_carbon.set_xlabel("time (UTC)")
    ax_power.set_title(f"joulesched report: {report.scope.describe()}")
    ax_power.legend(loc="upper left", fontsize="small")
    ax_power.grid(alpha=0.3)
    ax_carbon.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the command ----------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="joulesched report",
        description="Environmental impact (energy, CO2e, water, SCI) of a namespace, label selector, owner or Nextflow run, from Prometheus.",
    )
    p.add_argument(
        "--prometheus", default="http://127.0.0.1:9090", metavar="URL", help="Prometheus base URL (default %(default)s)"
    )
    scope = p.add_argument_group("scope (at least one; --namespace narrows the others)")
    scope.add_argument("--namespace", "-n", default="", metavar="NS")
    scope.add_argument(
        "--selector", "-l", default="", metavar="SEL", help="pod label selector, matched on kube_pod_labels"
    )
    scope.add_argument("--run", default="", metavar="NAME", help="Nextflow run name (pod label nextflow.io/runName)")
    scope.add_argument("--owner", default="", metavar="KIND/NAME", help="controller, e.g. Deployment/web or Job/etl")
    when = p.add_argument_group("time range")
    when.add_argument("--start", metavar="T", help="ISO 8601 (UTC if naive), unix seconds, now-2h")
    when.add_argument("--end", metavar="T", help="default: now")
    when.add_argument("--last", metavar="DURATION", help="the last DURATION up to now (instead of --start)")
    p.add_argument(
        "--step",
        default="60s",
        metavar="DURATION",
        help="interval of the integration (default 60s, the recording rules' minute)",
    )
    p.add_argument("--by", choices=BY_CHOICES, help="rows per (default: process for --run, else namespace)")
    p.add_argument("--per", choices=impact.FUNCTIONAL_UNITS, default="hour", help="SCI functional unit (default hour)")
    p.add_argument("--requests", type=float, metavar="N", help="number of requests in the range (for --per request)")
    p.add_argument(
        "--requests-query", metavar="PROMQL", help="PromQL giving the requests in the range; {range} is replaced by it"
    )
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--output", "-o", metavar="FILE", help="write the table/CSV/JSON here instead of stdout")
    p.add_argument("--chart", metavar="FILE.png", help="also draw IT power and cumulative CO2e over time")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS", help="per Prometheus query (default 30)")
    return p


def run(args: argparse.Namespace, prom: Prometheus, now: float) -> Report:
    scope = Scope(args.namespace, args.selector, args.run, args.owner)
    if not (scope.namespace or scope.selector or scope.run or scope.owner):
        raise ReportError("give a scope: --namespace, --selector, --run or --owner")
    step = parse_duration(args.step)
    if step != round(step):
        raise ReportError(f"--step {args.step}: must be a whole number of seconds")
    end = parse_time(args.end, now) if args.end else now
    if args.last and args.start:
        raise ReportError("give either --start or --last, not both")
    if args.last:
        start = end - parse_duration(args.last)
    elif args.start:
        start = parse_time(args.start, now)
    else:
        raise ReportError("give the range: --start (and --end) or --last")
    if end <= start:
        raise ReportError(f"--end ({_iso(end)}) must be after --start ({_iso(start)})")
    by = args.by or ("process" if scope.run else "namespace")
    data = fetch(prom, scope, start, end, step)
    seconds = float(data.steps[-1] - start)
    if args.per == "request":
        if args.requests is not None and args.requests_query:
            raise ReportError("give either --requests or --requests-query, not both")
        if args.requests_query:
            rows = prom.instant(args.requests_query.replace("{range}", f"{round(seconds)}s"), float(data.steps[-1]))
            requests = sum(float(r["value"][1]) for r in rows)
        elif args.requests is not None:
            requests = args.requests
        else:
            raise ReportError("--per request needs --requests N or --requests-query PROMQL")
        units = impact.functional_units("request", requests=requests)
    elif args.per == "run":
        in_scope = {(k[1], k[2]) for k in data.pods}
        runs = {run for pod, (run, _) in data.runs.items() if pod in in_scope}
        if not runs:
            raise ReportError(
                "--per run: no Nextflow runs among these pods (kube_pod_labels has no nextflow.io/runName for them)"
            )
        units = impact.functional_units("run", runs=len(runs))
    else:
        units = impact.functional_units("hour", seconds=seconds)
    return build_report(data, scope, start, by, args.per, units)


def main(argv: Sequence[str] | None = None, *, now: Callable[[], float] = time.time) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        report = run(args, Prometheus(args.prometheus, args.timeout), now())
        if args.format == "json":
            text = json.dumps(report.to_json(), indent=2) + "\n"
        elif args.format == "csv":
            text = render_csv(report)
        else:
            text = render_table(report)
        if args.output:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        else:
            sys.stdout.write(text)
        if args.chart:
            render_chart(report, args.chart)
    except ReportError as err:
        print(f"joulesched report: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"joulesched report: cannot write {err.filename}: {err.strerror}", file=sys.stderr)
        return 1
    return 0
