"""``joulesched report`` against the recording rules, on a real Prometheus holding fixed samples.

The samples (tests/impact/cluster.py) are written as OpenMetrics and turned into a TSDB block
with ``promtool tsdb create-blocks-from openmetrics`` before Prometheus starts: fixed timestamps
make every number hand-checkable and the test needs no waiting for scrapes (a live exposition
advanced between scrapes would take minutes per rule evaluation and give timing-dependent
numbers). The recording rules are then evaluated over the same history with
``promtool tsdb create-blocks-from rules`` — Prometheus' own rule engine, through its query
API — and their blocks loaded by restarting Prometheus. The report, which computes the
indicators in Python (policy.impact) from raw per-step queries, must give the rules' numbers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from joulesched.impact import cli as report_cli
from joulesched.impact import report, rules
from tests.impact.cluster import HOUR, T0, cluster
from tests.prometheus_server import PrometheusServer, require

pytestmark = pytest.mark.prometheus

RULES = rules.REPOSITORY_OUTPUT / "rules.yaml"
START, END = T0 + 600, T0 + 5400  # 00:10 .. 01:30, across the 01:00 change of grid intensity


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    promtool = require("promtool")
    base = tmp_path_factory.mktemp("impact")
    workdir = base / "prometheus"
    (base / "cluster.om").write_text(cluster())
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(base / "cluster.om"), str(workdir / "data")],
        check=True,
        capture_output=True,
    )
    server = PrometheusServer(workdir, [])
    try:
        rules_dir = base / "rules"
        rules_dir.mkdir()
        shutil.copy(RULES, rules_dir / "rules.yaml")
        done = subprocess.run(
            [
                promtool,
                "tsdb",
                "create-blocks-from",
                "rules",
                f"--start={int(START - 300)}",
                f"--end={int(END + 300)}",
                f"--url={server.url}",
                f"--output-dir={base / 'rule-blocks'}",
                "rules.yaml",
            ],
            cwd=rules_dir,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        server.stop()
    for block in (base / "rule-blocks").iterdir():
        shutil.move(str(block), workdir / "data" / block.name)
    server = PrometheusServer(workdir, [])
    try:
        yield server
    finally:
        server.stop()


def run_report(server: PrometheusServer, tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "report.json"
    code = report_cli.main(["--prometheus", server.url, "--format", "json", "--output", str(out), *args])
    assert code == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def test_the_report_is_hand_checkable(prom: PrometheusServer, tmp_path: Path) -> None:
    """Namespace shop, 00:10–01:30: p1 (120 W on north, 50 min at 400 g/kWh and 30 at 100) and
    p3 (10 W on south, 50 g/kWh, a server with no embodied figure)."""
    doc = run_report(prom, tmp_path, "--namespace", "shop", "--start", str(START), "--end", str(END), "--by", "pod")
    p1, p3 = doc["rows"]
    assert (p1["pod"], p3["pod"]) == ("p1", "p3")
    assert p1["it_kwh"] == pytest.approx(120 * 4800 / 3.6e6)  # 0.16 kWh
    assert p1["facility_kwh"] == pytest.approx(0.16 * 1.5)
    assert p1["operational_gco2e"] == pytest.approx(0.24 * (50 / 80) * 400 + 0.24 * (30 / 80) * 100)  # 60 + 9 g
    assert p1["embodied_gco2e"] == pytest.approx(0.015625 * 4800 * 120 / 200)  # 45 g: 60 % of server a
    assert p1["water_litres"] == pytest.approx(0.16 * 2)
    assert p1["renewable_kwh"] == pytest.approx(0.24 * 0.25)
    assert p3["operational_gco2e"] == pytest.approx(10 * 4800 * 1.2 / 3.6e6 * 50)  # 0.8 g
    assert p3["embodied_gco2e"] == 0 and p3["intervals_without_embodied"] == 80
    total = doc["total"]
    assert total["total_gco2e"] == pytest.approx(69.8 + 45)
    assert total["pods"] == 2 and doc["idle_policies"] == ["requests"]
    assert total["sci_gco2e_per_hour"] == pytest.approx((69.8 + 45) / (80 / 60))


def recorded(
    server: PrometheusServer, level: str, indicator: str
) -> dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]:
    """Every raw sample the backfilled rule recorded, by label set."""
    name = rules.record_name(level, indicator)
    out = {}
    for series in server.query(f"{name}[3h]", at=T0 + 2 * HOUR):
        labels = tuple(sorted((k, v) for k, v in series["metric"].items() if k != "__name__"))
        out[labels] = [(float(t), float(v)) for t, v in series["values"]]
    return out


# rule level -> the report's arguments for the same rows, and how a rule's labels name a row
CASES = {
    "pods of shop": ("namespace_pod", ["--namespace", "shop", "--by", "pod"], ("namespace", "pod")),
    "pods of wf (one stops at 00:51)": ("namespace_pod", ["--namespace", "wf", "--by", "pod"], ("namespace", "pod")),
    "namespace shop": ("namespace", ["--namespace", "shop"], ("namespace",)),
    "namespace wf": ("namespace", ["--namespace", "wf"], ("namespace",)),
    "owner Deployment/web": ("namespace_owner", ["--owner", "Deployment/web", "--by", "owner"], ("namespace", "owner")),
    "Nextflow run": ("workflow_run", ["--run", "happy_euler", "--by", "run"], ("namespace", "workflow_run")),
    "Nextflow processes": (
        "workflow_process",
        ["--run", "happy_euler", "--by", "process"],
        ("namespace", "workflow_run", "workflow_process"),
    ),
}
UNITS = {  # rule indicator -> (report column, factor from the rule's unit)
    "it_energy_joules": ("it_kwh", 1 / 3.6e6),
    "facility_energy_joules": ("facility_kwh", 1 / 3.6e6),
    "operational_emissions_grams": ("operational_gco2e", 1.0),
    "embodied_emissions_grams": ("embodied_gco2e", 1.0),
    "water_litres": ("water_litres", 1.0),
    "renewable_energy_joules": ("renewable_kwh", 1 / 3.6e6),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_the_report_gives_the_recording_rules_numbers(prom: PrometheusServer, tmp_path: Path, case: str) -> None:
    level, args, key_labels = CASES[case]
    rules = {ind: recorded(prom, level, ind) for ind in UNITS}
    # The rules' group evaluates at its own offset within the minute: run the report on the same steps.
    stamps = sorted({t for samples in rules["it_energy_joules"].values() for t, _ in samples if START <= t <= END})
    first, last = stamps[0], stamps[-1]
    doc = run_report(prom, tmp_path, *args, "--start", f"{first:.3f}", "--end", f"{last:.3f}")
    columns = report.GROUP_COLUMNS[doc["by"]]
    rows = {tuple(row[c] for c in columns): row for row in doc["rows"]}
    compared = 0
    for indicator, by_labels in rules.items():
        column, factor = UNITS[indicator]
        expected: dict[tuple[str, ...], float] = {}
        for labels, samples in by_labels.items():
            lab = dict(labels)
            if lab.get("namespace") not in {r[0] for r in rows}:
                continue
            key = tuple(lab[k] for k in key_labels)
            if doc["by"] == "owner":
                key = (lab["namespace"], f"{lab['owner_kind']}/{lab['owner']}")
            expected[key] = expected.get(key, 0.0) + sum(v for t, v in samples if first < t <= last) * factor
        for key, value in expected.items():
            assert rows[key][column] == pytest.approx(value, rel=1e-9, abs=1e-12), (case, indicator, key)
            compared += 1
        for key, row in rows.items():  # and nothing the rules do not have
            if key not in expected:
                assert row[column] == 0, (case, indicator, key)
    assert compared >= 6


def test_a_label_selector_chooses_pods_through_kube_state_metrics(prom: PrometheusServer, tmp_path: Path) -> None:
    span = ["--start", str(START), "--end", str(END), "--by", "pod"]
    web = run_report(prom, tmp_path, "--selector", "app=web,tier!=cache", *span)
    assert [r["pod"] for r in web["rows"]] == ["p1"]
    cache = run_report(prom, tmp_path, "--selector", "tier in (cache, db)", *span)
    assert [r["pod"] for r in cache["rows"]] == ["p3"]
    tasks = run_report(prom, tmp_path, "--selector", "nextflow.io/app=nextflow", "--namespace", "wf", *span)
    assert [r["pod"] for r in tasks["rows"]] == ["p2", "p4"]


def test_sci_per_run_counts_the_runs(prom: PrometheusServer, tmp_path: Path) -> None:
    doc = run_report(prom, tmp_path, "--run", "happy_euler", "--start", str(START), "--end", str(END), "--per", "run")
    assert doc["sci"] == {"per": "run", "functional_units": 1.0}
    assert doc["total"]["sci_gco2e_per_run"] == pytest.approx(doc["total"]["total_gco2e"])
    by_process = {r["process"]: r for r in doc["rows"]}
    assert set(by_process) == {"NFCORE_RNASEQ_FASTQC", "NFCORE_RNASEQ_MULTIQC"}
    # MULTIQC (p4, 25 W) ran 00:30:07–00:51:07: about 21 minutes of 25 W
    assert by_process["NFCORE_RNASEQ_MULTIQC"]["it_kwh"] == pytest.approx(25 * 21 * 60 / 3.6e6, rel=0.03)


def test_nothing_in_scope_is_an_error_naming_the_scope(
    prom: PrometheusServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code = report_cli.main(["--prometheus", prom.url, "--run", "no_such_run", "--start", str(START), "--end", str(END)])
    assert code == 1
    assert "no pods match Nextflow run no_such_run" in capsys.readouterr().err


def test_every_dashboard_expression_is_valid_promql(prom: PrometheusServer) -> None:
    for panel in rules.dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__interval", "1m").replace("$__range", "1h").replace("$namespace", ".*")
            prom.query(expr, at=T0 + HOUR)  # a parse error is an HTTP 400, raised here
