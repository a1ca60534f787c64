"""Generate the recording rules, the PrometheusRule and the Grafana dashboard of deploy/prometheus.

    joulesched rules                     # rewrite deploy/prometheus/{rules.yaml,operator/prometheusrule.yaml,dashboard.json}
    joulesched rules --check             # exit 1 when a file is out of date (the tests run this)
    joulesched rules --output-dir DIR    # write them elsewhere (an installed joulesched has no deploy/)

Metric names come from ``contracts/names.py`` (defined once). Every rule is computed from the
exported counters and gauges alone — no rule reads another rule — so that
``promtool tsdb create-blocks-from rules`` can backfill all of them in one pass.

The formulas (docs/impact.md; ``policy/impact.py`` computes the same in Python for
``joulesched report``), per pod and per one-minute interval::

    IT energy        E = Σ_domains increase(joulesched_pod_energy_joules_total[1m])
    facility energy  F = E × PUE(site)
    operational CO2e O = F / 3.6e6 × I(site)          gCO2e; I in gCO2e/kWh
    water            W = E / 3.6e6 × WUE(site)        litres; WUE per IT kWh
    renewable energy R = F × renewable share(site)
    embodied CO2e    M = E × m(server) × 60 / E_node  m = embodied grams / lifetime seconds

Site factors are the mean of each gauge over the same minute (``avg_over_time``), reached
through ``joulesched_node_info{node, site, server_id}``. A pod on a node with no site, or on a
server with no embodied figure, has no series for that indicator (the report counts them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from joulesched.contracts import names as n
from joulesched.policy import units

WINDOW = "1m"
WINDOW_SECONDS = 60
# policy.units.JOULES_PER_KWH as a PromQL literal: "3.6e6"
JOULES_PER_KWH = f"{units.JOULES_PER_KWH / 1e6:g}e6"

# Output labels of the workload levels (kube-state-metrics provides the pod → owner/label maps).
OWNER_LABELS = (n.L_OWNER_KIND, n.L_OWNER)
RUN_LABEL = n.L_WORKFLOW_RUN
PROCESS_LABEL = n.L_WORKFLOW_PROCESS
# kube-state-metrics exports pod label nextflow.io/runName as label_nextflow_io_run_name (it
# replaces invalid characters with "_" and snake-cases camelCase); it must be allow-listed:
#   --metric-labels-allowlist=pods=[nextflow.io/runName,nextflow.io/processName]
KSM_RUN = "label_nextflow_io_run_name"
KSM_PROCESS = "label_nextflow_io_process_name"

INDICATORS = (
    "it_energy_joules",
    "facility_energy_joules",
    "operational_emissions_grams",
    "embodied_emissions_grams",
    "water_litres",
    "renewable_energy_joules",
)


def record_name(level: str, indicator: str) -> str:
    return f"{level}:joulesched_pod_{indicator}:sum_increase{WINDOW}"


# -- building blocks -----------------------------------------------------------------------------

POD_IT = f"sum by (node, namespace, pod, idle_policy) (increase({n.POD_ENERGY.name}[{WINDOW}]))"
NODE_ENERGY = f"(sum by (node) (increase({n.NODE_DOMAIN_ENERGY.name}[{WINDOW}])) > 0)"


def site_factor(metric: n.Metric) -> str:
    """The factor per (node, site): the site gauge's mean over the window, joined via node_info."""
    return (
        f"(max by (node, site) ({n.NODE_INFO.name}) * on (site) group_left () "
        f"max by (site) (avg_over_time({metric.name}[{WINDOW}])))"
    )


EMBODIED_RATE = (
    f"(max by (node) (max by (node, server_id) ({n.NODE_INFO.name}) * on (server_id) group_left () "
    f"(max by (server_id) ({n.SERVER_EMBODIED.name}) / max by (server_id) ({n.SERVER_LIFETIME.name} > 0))))"
)

PUE = site_factor(n.SITE_PUE)


def pod_expr(indicator: str) -> str:
    """An indicator per pod (labels node, namespace, pod, idle_policy, and site where a site factor is used)."""
    if indicator == "it_energy_joules":
        return POD_IT
    if indicator == "facility_energy_joules":
        return f"{POD_IT} * on (node) group_left (site) {PUE}"
    if indicator == "operational_emissions_grams":
        return f"{POD_IT} * on (node) group_left (site) {PUE} * on (node) group_left () {site_factor(n.SITE_CARBON)} / {JOULES_PER_KWH}"
    if indicator == "water_litres":
        return f"{POD_IT} * on (node) group_left (site) {site_factor(n.SITE_WUE)} / {JOULES_PER_KWH}"
    if indicator == "renewable_energy_joules":
        return f"{POD_IT} * on (node) group_left (site) {PUE} * on (node) group_left () {site_factor(n.SITE_RENEWABLE)}"
    if indicator == "embodied_emissions_grams":
        return f"{POD_IT} * on (node) group_left () {EMBODIED_RATE} * {WINDOW_SECONDS} / on (node) group_left () {NODE_ENERGY}"
    raise ValueError(indicator)


OWNERS = (
    f'label_replace(max by (namespace, pod, owner_kind, owner_name) (kube_pod_owner{{owner_is_controller="true"}}), '
    f'"{n.L_OWNER}", "$1", "owner_name", "(.*)")'
)
RUNS = (
    f'label_replace(label_replace(max by (namespace, pod, {KSM_RUN}, {KSM_PROCESS}) (kube_pod_labels{{{KSM_RUN}!=""}}), '
    f'"{RUN_LABEL}", "$1", "{KSM_RUN}", "(.*)"), "{PROCESS_LABEL}", "$1", "{KSM_PROCESS}", "(.*)")'
)

# level -> (the labels it keeps, how pods join it or None)
LEVELS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "namespace_pod": (("node", "namespace", "pod", "idle_policy"), None),
    "namespace": (("namespace", "idle_policy"), None),
    "namespace_owner": (
        ("namespace", *OWNER_LABELS, "idle_policy"),
        f"on (namespace, pod) group_left ({', '.join(OWNER_LABELS)}) {OWNERS}",
    ),
    "workflow_run": (
        ("namespace", RUN_LABEL, "idle_policy"),
        f"on (namespace, pod) group_left ({RUN_LABEL}, {PROCESS_LABEL}) {RUNS}",
    ),
    "workflow_process": (
        ("namespace", RUN_LABEL, PROCESS_LABEL, "idle_policy"),
        f"on (namespace, pod) group_left ({RUN_LABEL}, {PROCESS_LABEL}) {RUNS}",
    ),
}

GROUPS = (
    ("joulesched-impact-pod", ("namespace_pod",), "Per pod; site factors through joulesched_node_info."),
    ("joulesched-impact-namespace", ("namespace",), "Per namespace."),
    ("joulesched-impact-owner", ("namespace_owner",), "Per controller (kube-state-metrics kube_pod_owner)."),
    (
        "joulesched-impact-workflow",
        ("workflow_run", "workflow_process"),
        "Per Nextflow run and process (kube-state-metrics kube_pod_labels).",
    ),
)


def level_expr(level: str, indicator: str) -> str:
    keep, join = LEVELS[level]
    expr = pod_expr(indicator)
    if level == "namespace_pod":
        return expr
    if join is not None:
        expr = f"({expr}) * {join}"
    return f"sum by ({', '.join(keep)}) ({expr})"


POWER_RULE = "node:joulesched_node_domain_energy_joules:sum_rate5m"


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for name, levels, _ in GROUPS:
        rules = [
            {"record": record_name(level, ind), "expr": level_expr(level, ind)}
            for level in levels
            for ind in INDICATORS
        ]
        groups.append({"name": name, "interval": WINDOW, "rules": rules})
    groups.append(
        {
            "name": "joulesched-power",
            "interval": "30s",
            "rules": [{"record": POWER_RULE, "expr": f"sum by (node) (rate({n.NODE_DOMAIN_ENERGY.name}[5m]))"}],
        }
    )
    return groups


RULES_HEADER = """\
# joulesched recording rules: per-pod, per-namespace, per-owner and per-Nextflow-run environmental
# indicators from the agent's counters. GENERATED by joulesched rules — do not edit.
#
# Each rule records the indicator's increment over the last minute (evaluated every minute), so
# a total over a range is sum_over_time(<rule>[range]). Units: joules, grams CO2e, litres.
#   IT energy        E = Σ_domains increase(joulesched_pod_energy_joules_total[1m])
#   facility energy  F = E × PUE                 operational CO2e  O = F / 3.6e6 × grid intensity
#   water            W = E / 3.6e6 × WUE         renewable energy  R = F × renewable share
#   embodied CO2e    M = E × (server embodied g / lifetime s) × 60 / node energy
# Site factors are each gauge's mean over the same minute, joined through joulesched_node_info.
# No rule reads another, so `promtool tsdb create-blocks-from rules` backfills them in one pass.
# The owner and workflow groups need kube-state-metrics (the workflow group with
#   --metric-labels-allowlist=pods=[nextflow.io/runName,nextflow.io/processName]).
"""


def rules_yaml() -> str:
    body = yaml.safe_dump({"groups": rule_groups()}, sort_keys=False, width=10_000)
    return RULES_HEADER + body


def prometheusrule_yaml() -> str:
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "joulesched-impact",
            "namespace": "joulesched",
            "labels": {"app.kubernetes.io/part-of": "joulesched"},
        },
        "spec": {"groups": rule_groups()},
    }
    head = "# The recording rules of ../rules.yaml as a Prometheus Operator PrometheusRule. GENERATED by\n# joulesched rules — do not edit.\n"
    return head + yaml.safe_dump(doc, sort_keys=False, width=10_000)


# -- dashboard -----------------------------------------------------------------------------------

DS = {"type": "prometheus", "uid": "${datasource}"}


def _panel(
    pid: int,
    title: str,
    kind: str,
    grid: tuple[int, int, int, int],
    targets: list[dict[str, Any]],
    unit: str,
    description: str = "",
) -> dict[str, Any]:
    x, y, w, h = grid
    panel: dict[str, Any] = {
        "id": pid,
        "title": title,
        "type": kind,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
        "targets": [{"datasource": DS, "refId": chr(ord("A") + i), **t} for i, t in enumerate(targets)],
    }
    if description:
        panel["description"] = description
    if any("$__interval" in t.get("expr", "") for t in targets):
        # The recorded series are one sample per minute: a shorter step would sum empty ranges.
        panel["interval"] = WINDOW
    if kind == "timeseries":
        panel["fieldConfig"]["defaults"]["custom"] = {
            "drawStyle": "line",
            "fillOpacity": 10,
            "stacking": {"mode": "none"},
        }
        panel["options"] = {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}
    return panel


def _row(pid: int, title: str, y: int) -> dict[str, Any]:
    return {
        "id": pid,
        "type": "row",
        "title": title,
        "collapsed": False,
        "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
        "panels": [],
    }


def _per_interval(level: str, indicator: str, by: str, scale: str = "") -> str:
    ns = '{namespace=~"$namespace"}'
    return f"sum by ({by}) (sum_over_time({record_name(level, indicator)}{ns}[$__interval])){scale}"


def _range_total(level: str, indicator: str, by: str, scale: str = "") -> str:
    ns = '{namespace=~"$namespace"}'
    return f"sum by ({by}) (sum_over_time({record_name(level, indicator)}{ns}[$__range])){scale}"


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid = 0

    def nid() -> int:
        nonlocal pid
        pid += 1
        return pid

    per_kwh = f" / {JOULES_PER_KWH}"
    panels.append(_row(nid(), "Power", 0))
    panels.append(
        _panel(
            nid(),
            "Cluster power",
            "timeseries",
            (0, 1, 12, 8),
            [
                {"expr": f"sum({POWER_RULE})", "legendFormat": "cluster"},
                {"expr": f"sum by (node) ({POWER_RULE})", "legendFormat": "{{node}}"},
            ],
            "watt",
            "Measured node power (rate of the node's energy counters over 5 minutes).",
        )
    )
    panels.append(
        _panel(
            nid(),
            "Grid carbon intensity by site",
            "timeseries",
            (12, 1, 12, 8),
            [{"expr": f"max by (site) ({n.SITE_CARBON.name})", "legendFormat": "{{site}}"}],
            "none",
            "gCO2e per kWh, as the agents export it.",
        )
    )
    panels.append(_row(nid(), "Impact by namespace", 9))
    panels.append(
        _panel(
            nid(),
            "Totals over the dashboard range",
            "table",
            (0, 10, 24, 8),
            [
                {
                    "expr": _range_total("namespace", "it_energy_joules", "namespace", per_kwh),
                    "instant": True,
                    "format": "table",
                    "legendFormat": "IT kWh",
                },
                {
                    "expr": _range_total("namespace", "facility_energy_joules", "namespace", per_kwh),
                    "instant": True,
                    "format": "table",
                    "legendFormat": "facility kWh",
                },
                {
                    "expr": _range_total("namespace", "operational_emissions_grams", "namespace"),
                    "instant": True,
                    "format": "table",
                    "legendFormat": "operational gCO2e",
                },
                {
                    "expr": _range_total("namespace", "embodied_emissions_grams", "namespace"),
                    "instant": True,
                    "format": "table",
                    "legendFormat": "embodied gCO2e",
                },
                {
                    "expr": _range_total("namespace", "water_litres", "namespace"),
                    "instant": True,
                    "format": "table",
                    "legendFormat": "water L",
                },
            ],
            "none",
            "The same numbers as `joulesched report --namespace NS` for the dashboard's time range.",
        )
    )
    panels[-1]["transformations"] = [{"id": "merge", "options": {}}]
    panels.append(
        _panel(
            nid(),
            "IT energy per namespace",
            "timeseries",
            (0, 18, 12, 8),
            [
                {
                    "expr": _per_interval("namespace", "it_energy_joules", "namespace", per_kwh),
                    "legendFormat": "{{namespace}}",
                }
            ],
            "kwatth",
            "Attributed energy (CPU, DRAM, GPU, rest of the server; idle share per idle_policy) per interval.",
        )
    )
    panels.append(
        _panel(
            nid(),
            "CO2e per namespace",
            "timeseries",
            (12, 18, 12, 8),
            [
                {
                    "expr": _per_interval("namespace", "operational_emissions_grams", "namespace"),
                    "legendFormat": "{{namespace}} operational",
                },
                {
                    "expr": _per_interval("namespace", "embodied_emissions_grams", "namespace"),
                    "legendFormat": "{{namespace}} embodied",
                },
            ],
            "massg",
            "Operational (facility energy × grid intensity, integrated per minute) and embodied (amortised servers) per interval.",
        )
    )
    panels.append(
        _panel(
            nid(),
            "Water per namespace",
            "timeseries",
            (0, 26, 12, 8),
            [{"expr": _per_interval("namespace", "water_litres", "namespace"), "legendFormat": "{{namespace}}"}],
            "litre",
            "IT energy × WUE per interval.",
        )
    )
    panels.append(
        _panel(
            nid(),
            "Facility energy per Nextflow run",
            "timeseries",
            (12, 26, 12, 8),
            [
                {
                    "expr": _per_interval("workflow_run", "facility_energy_joules", f"namespace, {RUN_LABEL}", per_kwh),
                    "legendFormat": "{{namespace}}/{{" + RUN_LABEL + "}}",
                }
            ],
            "kwatth",
            "Needs kube-state-metrics with the nextflow.io labels allow-listed.",
        )
    )
    panels.append(_row(nid(), "Scheduler", 34))
    panels.append(
        _panel(
            nid(),
            "Node scores",
            "timeseries",
            (0, 35, 12, 8),
            [{"expr": f"max by (node) ({n.EXT_NODE_SCORE.name})", "legendFormat": "{{node}}"}],
            "none",
            "The last score the extender gave each node (0..10).",
        )
    )
    panels.append(
        _panel(
            nid(),
            "Extender decisions",
            "timeseries",
            (12, 35, 12, 8),
            [
                {"expr": f"sum by (verb, code) (rate({n.EXT_REQUESTS.name}[5m]))", "legendFormat": "{{verb}} {{code}}"},
                {"expr": f"sum by (reason) (rate({n.EXT_FILTERED.name}[5m]))", "legendFormat": "filtered: {{reason}}"},
                {"expr": f"sum by (reason) (rate({n.EXT_NEUTRAL.name}[5m]))", "legendFormat": "neutral: {{reason}}"},
                {"expr": f"sum by (kept) (rate({n.EXT_FILTER_KEPT.name}[5m]))", "legendFormat": "filter kept: {{kept}}"},
            ],
            "reqps",
        )
    )
    panels.append(
        _panel(
            nid(),
            "Extender failures",
            "timeseries",
            (0, 43, 12, 8),
            [
                {
                    "expr": f"sum by (verb, reason) (rate({n.EXT_FAILURES.name}[5m]))",
                    "legendFormat": "{{verb}}: {{reason}}",
                },
                {
                    "expr": f"sum by (source) (rate({n.EXT_SOURCE_ERRORS.name}[5m]))",
                    "legendFormat": "profile source {{source}}",
                },
            ],
            "reqps",
        )
    )
    panels.append(
        _panel(
            nid(),
            "Extender latency (p99)",
            "timeseries",
            (12, 43, 12, 8),
            [
                {
                    "expr": f"histogram_quantile(0.99, sum by (le, verb) (rate({n.EXT_LATENCY.name}_bucket[5m])))",
                    "legendFormat": "{{verb}}",
                }
            ],
            "s",
        )
    )
    return {
        "title": "joulesched: energy, carbon and scheduling",
        "uid": "joulesched-impact",
        "tags": ["joulesched", "energy", "carbon"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "1m",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {
                    "name": "namespace",
                    "type": "query",
                    "datasource": DS,
                    "query": {
                        "query": f"label_values({record_name('namespace', 'it_energy_joules')}, namespace)",
                        "refId": "ns",
                    },
                    "definition": f"label_values({record_name('namespace', 'it_energy_joules')}, namespace)",
                    "multi": True,
                    "includeAll": True,
                    "allValue": ".*",
                    "refresh": 2,
                    "label": "Namespace",
                },
            ]
        },
        "panels": panels,
    }


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


# Each generated file, relative to the output directory (deploy/prometheus in the repository).
OUTPUTS = {
    Path("rules.yaml"): rules_yaml,
    Path("operator") / "prometheusrule.yaml": prometheusrule_yaml,
    Path("dashboard.json"): dashboard_json,
}
# deploy/prometheus of the checkout this module runs from (the default output directory).
REPOSITORY_OUTPUT = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"


def _not_a_folder(out: Path) -> str | None:
    """Why ``out`` cannot be a folder: it, or the nearest of its parents that exists, is a file."""
    if out.exists():
        return None if out.is_dir() else f"{out} is a file, not a folder"
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    return None if parent.is_dir() else f"{parent} is a file, not a folder"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="joulesched rules", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated file is out of date")
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help="where rules.yaml, operator/prometheusrule.yaml and dashboard.json go "
        "(default: deploy/prometheus of the checkout joulesched runs from)",
    )
    args = parser.parse_args(argv)
    if args.output_dir is None:
        if not REPOSITORY_OUTPUT.is_dir():  # an installed joulesched: never write into site-packages
            print(
                f"joulesched rules: {REPOSITORY_OUTPUT} does not exist (joulesched is installed, not run from a "
                "checkout): give --output-dir DIR",
                file=sys.stderr,
            )
            return 2
        args.output_dir = REPOSITORY_OUTPUT
    wrong = _not_a_folder(args.output_dir)
    if wrong:
        print(f"joulesched rules: --output-dir {args.output_dir}: {wrong}", file=sys.stderr)
        return 2
    stale: list[str] = []
    for relative, render in OUTPUTS.items():
        path = args.output_dir / relative
        text = render()
        try:
            if args.check:
                if not path.exists() or path.read_text(encoding="utf-8") != text:
                    stale.append(str(path))
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
        except OSError as err:
            done = "read" if args.check else "write"
            said = f"--output-dir {args.output_dir}: cannot {done} {path}: {err.strerror or err}"
            print(f"joulesched rules: {said}", file=sys.stderr)
            return 2
    for name in stale:
        print(f"{name} is out of date: run joulesched rules", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
