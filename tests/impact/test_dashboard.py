"""The Grafana dashboard: valid JSON whose panels read only metrics and rules that exist.

Every expression is also parsed by a real Prometheus in test_report_prometheus.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from joulesched.contracts import names as n
from joulesched.impact import rules

DIR = rules.REPOSITORY_OUTPUT
DASHBOARD: dict[str, Any] = json.loads((DIR / "dashboard.json").read_text())
RULE_NAMES = {r["record"] for g in yaml.safe_load((DIR / "rules.yaml").read_text())["groups"] for r in g["rules"]}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def known_series() -> set[str]:
    names = set(RULE_NAMES)
    for m in n.METRICS:
        names.add(m.name)
        if m.type == "histogram":
            names.update(m.name + s for s in HISTOGRAM_SUFFIXES)
    return names


def exprs() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in DASHBOARD["panels"] for t in p.get("targets", [])]


def test_the_dashboard_is_grafana_json() -> None:
    assert DASHBOARD["uid"] == "joulesched-impact" and DASHBOARD["schemaVersion"] >= 36
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in DASHBOARD["templating"]["list"]}
    assert variables == {"datasource", "namespace"}
    for panel in DASHBOARD["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]


def test_no_two_panels_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in DASHBOARD["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_every_panel_reads_metrics_or_rules_that_exist() -> None:
    known = known_series()
    for title, expr in exprs():
        referenced = set(re.findall(r"\b(?:joulesched_[a-z0-9_]+|[a-z_]+:joulesched_[a-z_]+:[a-z0-9_]+)", expr))
        assert referenced, f"{title}: {expr}"
        for name in referenced:
            assert name in known, f"panel {title!r} reads {name}, which neither names.py nor rules.yaml defines"
        for variable in re.findall(r"\$(\w+)", expr):
            assert variable in {"namespace", "__interval", "__range"}, f"{title}: unknown variable ${variable}"


def test_the_panels_the_issue_asks_for() -> None:
    text = json.dumps(DASHBOARD)
    for needle in (
        rules.POWER_RULE,  # cluster power
        rules.record_name("namespace", "it_energy_joules"),  # per-namespace energy
        rules.record_name("namespace", "operational_emissions_grams"),  # and CO2e
        rules.record_name("namespace", "embodied_emissions_grams"),
        n.EXT_NODE_SCORE.name,  # node scores
        n.EXT_REQUESTS.name,  # the extender's decisions
        n.EXT_FAILURES.name,  # and failures
    ):
        assert needle in text, needle


def test_panels_over_the_minute_rules_never_step_below_a_minute() -> None:
    """sum_over_time(rule[$__interval]) over one sample a minute is empty below 1m."""
    for panel in DASHBOARD["panels"]:
        if any("$__interval" in t.get("expr", "") for t in panel.get("targets", [])):
            assert panel.get("interval") == rules.WINDOW, panel["title"]
