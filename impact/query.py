"""Reading Prometheus for ``joulesched report``: pod selectors as PromQL matchers, the
scope's pods (through kube-state-metrics) and every per-step series the indicators need."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from joulesched.contracts import names as n
from joulesched.impact.errors import ReportError

MAX_POINTS = 10_000  # Prometheus refuses more than 11,000 points per series in one range query
KSM_RUN = "label_nextflow_io_run_name"
KSM_PROCESS = "label_nextflow_io_process_name"

FloatArray = np.ndarray


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


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
            lambda: self._client.custom_query_range(query, start, end, duration(step), params=exact),
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
        return ", ".join(parts) or "every namespace"


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
    if pods is not None and not pods:
        return set(), {}, {}
    runs, owner_map = pod_labels(prom, pods, ns, window, end)
    return pods, runs, owner_map


def pod_labels(
    prom: Prometheus, pods: set[tuple[str, str]] | None, ns: list[str], window: str, end: float
) -> tuple[dict[tuple[str, str], tuple[str, str]], dict[tuple[str, str], str]]:
    """The Nextflow run/process and the controlling owner of each pod (those of ``ns`` when ``pods`` is None)."""
    pod_ns = [*ns]
    if pods is not None:
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
    return runs, owner_map


def duration(seconds: float) -> str:
    """A PromQL duration: whole seconds, else milliseconds (``1.2096e+06s`` is not one)."""
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{round(seconds * 1000)}ms"


def ranged(prom: Prometheus, query: str, steps: FloatArray, step: float) -> list[dict[str, Any]]:
    """``query`` at every step of ``steps``, in ranges of at most MAX_POINTS steps."""
    out: list[dict[str, Any]] = []
    for lo in range(0, len(steps), MAX_POINTS):
        hi = min(lo + MAX_POINTS, len(steps)) - 1
        out.extend(prom.range(query, float(steps[lo]), float(steps[hi]), step))
    return out


def step_ends(start: float, end: float, step: float) -> FloatArray:
    """The ends ``start + k·step`` (k ≥ 1) of the whole steps of the range."""
    count = math.floor((end - start) / step + 1e-9)
    if count < 1:
        raise ReportError(f"the range ({end - start:g} s) is shorter than one step ({step:g} s)")
    return start + step * np.arange(1, count + 1, dtype=np.float64)


def fetch(prom: Prometheus, scope: Scope, start: float, end: float, step: float) -> Fetched:
    """Read every series the indicators need for the steps ending at ``start + k·step`` (k ≥ 1)."""
    steps = step_ends(start, end, step)
    pods, runs, owners = resolve_pods(prom, scope, start, end)
    window = duration(step)
    if pods is not None and not pods:
        raise ReportError(f"no pods match {scope.describe()} between {iso(start)} and {iso(end)}")
    if pods is None:
        matchers = f"namespace={_quote(scope.namespace)}"
    else:
        matchers = (
            f"namespace=~{_quote(_alternation(p[0] for p in pods))}, pod=~{_quote(_alternation(p[1] for p in pods))}"
        )

    def at_steps(query: str) -> list[dict[str, Any]]:
        return ranged(prom, query, steps, step)

    pod_keys = ("node", "namespace", "pod", "idle_policy")
    pod_rows = at_steps(
        f"sum by (node, namespace, pod, idle_policy) (increase({n.POD_ENERGY.name}{{{matchers}}}[{window}]))"
    )
    pod_energy = _matrix(pod_rows, pod_keys, steps, step)
    if pods is not None:
        pod_energy = {k: v for k, v in pod_energy.items() if (k[1], k[2]) in pods}
    if not pod_energy:
        raise ReportError(
            f"no pod energy for {scope.describe()} between {iso(start)} and {iso(end)} (is the agent scraped?)"
        )
    nodes = sorted({k[0] for k in pod_energy})
    node_match = f"node=~{_quote(_alternation(nodes))}"
    node_energy = _matrix(
        at_steps(f"sum by (node) (increase({n.NODE_DOMAIN_ENERGY.name}{{{node_match}}}[{window}]))"),
        ("node",),
        steps,
        step,
    )
    info = _matrix(
        at_steps(f"max by (node, site, server_id) ({n.NODE_INFO.name}{{{node_match}}})"),
        ("node", "site", "server_id"),
        steps,
        step,
    )
    sites = sorted({k[1] for k in info})
    servers = sorted({k[2] for k in info})
    factors: dict[str, dict[str, FloatArray]] = {}
    for name, metric in FACTORS.items():
        rows = (
            at_steps(f"max by (site) (avg_over_time({metric.name}{{site=~{_quote(_alternation(sites))}}}[{window}]))")
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
                at_steps(f"max by (server_id) ({n.SERVER_EMBODIED.name}{{{server_match}}})"), ("server_id",), steps, step
            ).items()
        }
        lifetime = {
            k[0]: v
            for k, v in _matrix(
                at_steps(f"max by (server_id) ({n.SERVER_LIFETIME.name}{{{server_match}}} > 0)"),
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
