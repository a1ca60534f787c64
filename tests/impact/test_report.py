"""``joulesched report`` without Prometheus: arguments, selectors, the per-step maths and the outputs."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest

from joulesched import cli
from joulesched.impact import cli as report_cli
from joulesched.impact import output, query, report
from joulesched.impact.query import Fetched, ReportError, Scope

T0 = 1654041600.0
NAN = np.nan


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("5m", 300), ("1h30m", 5400), ("2d", 172800), ("60", 60), ("1.5h", 5400), ("250ms", 0.25)],
)
def test_durations(text: str, seconds: float) -> None:
    assert report_cli.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "-5m", "0s", "1h-3m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ReportError):
        report_cli.parse_duration(text)


def test_times() -> None:
    now = T0 + 7200
    assert report_cli.parse_time("2022-06-01T00:00:00Z", now) == T0
    assert report_cli.parse_time("2022-06-01T00:00:00", now) == T0  # naive is UTC
    assert report_cli.parse_time("2022-06-01T02:00:00+02:00", now) == T0
    assert report_cli.parse_time(str(T0), now) == T0
    assert report_cli.parse_time("now", now) == now
    assert report_cli.parse_time("now-2h", now) == T0
    with pytest.raises(ReportError, match="is not a time"):
        report_cli.parse_time("last tuesday", now)


@pytest.mark.parametrize(
    ("key", "label"),
    [
        ("nextflow.io/runName", "label_nextflow_io_run_name"),
        ("nextflow.io/processName", "label_nextflow_io_process_name"),
        ("app.kubernetes.io/name", "label_app_kubernetes_io_name"),
        ("tier", "label_tier"),
        ("team-A", "label_team_a"),
    ],
)
def test_pod_labels_as_kube_state_metrics_names_them(key: str, label: str) -> None:
    assert query.ksm_label(key) == label


@pytest.mark.parametrize(
    ("selector", "matchers"),
    [
        ("app=web", ['label_app="web"']),
        ("app==web,tier!=db", ['label_app="web"', 'label_tier!="db"']),
        ("env in (prod, staging),tier notin (db)", ['label_env=~"prod|staging"', 'label_tier!~"db"']),
        ("canary", ['label_canary!=""']),
        ("!canary", ['label_canary=""']),
        ("nextflow.io/runName=happy_euler", ['label_nextflow_io_run_name="happy_euler"']),
        ("version in (1.2)", ['label_version=~"1\\\\.2"']),
    ],
)
def test_label_selectors_become_promql_matchers(selector: str, matchers: list[str]) -> None:
    assert query.selector_matchers(selector) == matchers


@pytest.mark.parametrize("selector", ["", "a b=c", "=x"])
def test_bad_selectors(selector: str) -> None:
    with pytest.raises(ReportError):
        query.selector_matchers(selector)


def fetched() -> Fetched:
    """Three minutes. shop/p1 (120 W) and wf/p2 (50 W, absent in minute 2) on node a at site north
    (PUE 1.5; 400, 400 then 100 g/kWh; WUE 2; renewable 0.25; server srv-a, 0.015625 g/s);
    shop/p3 (10 W) on node b at site south (PUE 1.2; 50 g/kWh; server without embodied figure);
    shop/p5 (1 W, idle policy bucket) on node c, which has no site at all."""
    steps = T0 + 60.0 * np.arange(1, 4)
    ones = np.ones(3)
    return Fetched(
        steps=steps,
        step=60.0,
        pods={
            ("a", "shop", "p1", "requests"): np.full(3, 7200.0),
            ("a", "wf", "p2", "requests"): np.array([3000.0, NAN, 3000.0]),
            ("b", "shop", "p3", "requests"): np.full(3, 600.0),
            ("c", "shop", "p5", "bucket"): np.full(3, 60.0),
        },
        nodes={"a": np.full(3, 12000.0), "b": np.full(3, 1200.0), "c": np.full(3, 100.0)},
        node_info={("a", "north", "srv-a"): ones, ("b", "south", "srv-b"): ones},
        factors={
            "pue": {"north": 1.5 * ones, "south": 1.2 * ones},
            "intensity": {"north": np.array([400.0, 400.0, 100.0]), "south": 50 * ones},
            "wue": {"north": 2 * ones, "south": 0 * ones},
            "renewable_share": {"north": 0.25 * ones, "south": ones},
        },
        embodied={"srv-a": 1971000 * ones},
        lifetime={"srv-a": 126144000 * ones},
        owners={("shop", "p1"): "ReplicaSet/web-5d"},
        runs={("wf", "p2"): ("happy_euler", "NFCORE_RNASEQ_FASTQC")},
    )


def test_the_per_step_maths_by_namespace() -> None:
    rep = report.build_report(fetched(), Scope(namespace="shop"), T0, "namespace", "hour", 0.05)
    (shop_key, shop_pods, shop), (wf_key, _, wf) = rep.rows
    assert (shop_key, wf_key, shop_pods) == (("shop",), ("wf",), 3)
    assert shop.it_joules == 3 * (7200 + 600 + 60)
    assert shop.facility_joules == pytest.approx(3 * (10800 + 720))  # p5 has no site: left out
    assert shop.operational_grams == pytest.approx(
        10800 * (400 + 400 + 100) / 3.6e6 + 3 * 720 * 50 / 3.6e6
    )  # 2.7 + 0.03
    assert shop.embodied_grams == pytest.approx(3 * 0.015625 * 60 * 0.6)  # p3's server has no figure, p5 no server
    assert shop.water_litres == pytest.approx(3 * 7200 * 2 / 3.6e6)
    assert (shop.missing_site, shop.missing_embodied) == (3, 6)
    assert wf.operational_grams == pytest.approx(
        4500 * 400 / 3.6e6 + 4500 * 100 / 3.6e6
    )  # the absent minute is no energy
    assert (wf.missing_site, wf.missing_embodied) == (0, 0)
    assert rep.total.it_joules == shop.it_joules + wf.it_joules
    assert rep.idle_policies == ("bucket", "requests") and rep.pods == 4
    assert rep.total.sci(rep.units) == pytest.approx(rep.total.carbon_grams / 0.05)


def test_rows_by_owner_run_and_process() -> None:
    data = fetched()
    by_owner = {g: t for g, _, t in report.build_report(data, Scope(namespace="shop"), T0, "owner", "hour", 1).rows}
    assert set(by_owner) == {("shop", "ReplicaSet/web-5d"), ("shop", "<none>"), ("wf", "<none>")}
    assert by_owner[("shop", "ReplicaSet/web-5d")].it_joules == 3 * 7200
    by_process = {g for g, _, _ in report.build_report(data, Scope(run="happy_euler"), T0, "process", "run", 1).rows}
    assert ("wf", "happy_euler", "NFCORE_RNASEQ_FASTQC") in by_process
    by_node = {g: pods for g, pods, _ in report.build_report(data, Scope(namespace="shop"), T0, "node", "hour", 1).rows}
    assert by_node == {("a",): 2, ("b",): 1, ("c",): 1}


def test_a_node_with_two_sites_at_once_has_no_site() -> None:
    data = fetched()
    data.node_info[("a", "south", "srv-a")] = np.ones(3)  # relabelled: which PUE? neither, and counted
    rows = {g: t for g, _, t in report.build_report(data, Scope(namespace="wf"), T0, "namespace", "hour", 1).rows}
    assert rows[("wf",)].facility_joules == 0 and rows[("wf",)].missing_site == 2


def test_table_csv_json_and_chart(tmp_path: Path) -> None:
    rep = report.build_report(fetched(), Scope(namespace="shop"), T0, "pod", "hour", 0.05)
    table = output.render_table(rep)
    assert "joulesched report: namespace shop" in table and "TOTAL" in table
    assert "idle policy bucket, requests" in table
    assert (
        "a site factor unknown (a node without joulesched_node_info, a site gauge absent) are not counted in: "
        "operational CO2e (3), facility energy (3), water (3), renewable energy (3)"
    ) in table
    assert "idle policy 'bucket'" in table
    rows = list(csv.DictReader(io.StringIO(output.render_csv(rep))))
    assert [r["pod"] for r in rows] == ["p1", "p3", "p5", "p2", ""] and rows[-1]["namespace"] == "TOTAL"
    doc = rep.to_json()
    assert doc["rows"][0]["it_kwh"] == pytest.approx(3 * 7200 / 3.6e6)
    assert doc["total"]["sci_gco2e_per_hour"] == pytest.approx(doc["total"]["total_gco2e"] / 0.05)
    json.dumps(doc)  # plain JSON
    chart = tmp_path / "impact.png"
    output.render_chart(rep, str(chart), top=2)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--last", "1h"], "give a scope"),
        (["--namespace", "x"], "give the range"),
        (["--namespace", "x", "--start", "now-1h", "--last", "1h"], "either --start or --last"),
        (["--namespace", "x", "--start", "now", "--end", "now-1h"], "must be after --start"),
        (["--namespace", "x", "--last", "1h", "--step", "1.5s"], "whole number of seconds"),
        (["--namespace", "x", "--last", "30s"], "shorter than one step"),
        (["--owner", "web", "--last", "1h"], "give KIND/NAME"),
    ],
)
def test_argument_errors_are_reported_without_a_traceback(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    class Unused:
        def instant(self, query: str, at: float) -> list[dict[str, object]]:
            return []

        def range(self, query: str, first: float, last: float, step: float) -> list[dict[str, object]]:
            return []

    ns = report_cli._parser().parse_args(args)
    with pytest.raises(ReportError, match=message):
        report_cli.run(ns, Unused(), T0)  # type: ignore[arg-type]


def test_an_unreachable_prometheus_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = report_cli.main(["--prometheus", "http://127.0.0.1:9", "--namespace", "shop", "--last", "1h", "--timeout", "2"])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("joulesched report: Prometheus at http://127.0.0.1:9: query") and "check --prometheus" in err


def test_the_command_is_reachable_from_the_joulesched_cli(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["report", "--help"])
    assert done.value.code == 0
    assert "--namespace" in capsys.readouterr().out


class Recorded:
    """A Prometheus that records every query and answers ``answer`` to instant ones (no range data)."""

    def __init__(self, answer: object = None) -> None:
        self.queries: list[str] = []
        self.steps: list[tuple[float, float, float]] = []
        self.answer = [] if answer is None else answer

    def instant(self, query: str, at: float) -> object:
        self.queries.append(query)
        return self.answer

    def range(self, query: str, first: float, last: float, step: float) -> list[dict[str, object]]:
        self.queries.append(query)
        self.steps.append((first, last, step))
        if round((last - first) / step) + 1 > 11_000:  # as Prometheus refuses it
            raise ReportError("exceeded maximum resolution of 11,000 points per timeseries")
        return []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1654041600000", r"not a time between 1970 and 9999 in unix seconds \(milliseconds\? give unix seconds\)"),
        ("nan", "not a time between 1970 and 9999"),
        ("inf", "not a time between 1970 and 9999"),
        ("-5", "not a time between 1970 and 9999"),
    ],
)
def test_a_number_that_is_no_time_is_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        report_cli.parse_time(text, T0)


@pytest.mark.parametrize(
    ("args", "answer", "message"),
    [
        (["--requests-query", "sum(increase(http_requests_total[{range}]))"], [], "returned no series"),
        (["--requests-query", "sum(x[{range}])"], [{"metric": {}}], "did not return an instant vector or a scalar"),
    ],
)
def test_requests_that_give_no_sci_are_refused_not_reported_as_none(
    monkeypatch: pytest.MonkeyPatch, args: list[str], answer: object, message: str
) -> None:
    monkeypatch.setattr(report_cli, "fetch", lambda *a: fetched())
    ns = report_cli._parser().parse_args(["--namespace", "shop", "--start", str(T0), "--end", str(T0 + 180), "--per", "request", *args])
    with pytest.raises(ReportError, match=message):
        report_cli.run(ns, Recorded(answer), T0)  # type: ignore[arg-type]


def test_a_scalar_answer_to_the_requests_query_is_the_number_of_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report_cli, "fetch", lambda *a: fetched())
    ns = report_cli._parser().parse_args(
        ["--namespace", "shop", "--start", str(T0), "--end", str(T0 + 180), "--per", "request", "--requests-query", "scalar(x)"]
    )
    rep = report_cli.run(ns, Recorded([T0 + 180, "250"]), T0)  # type: ignore[arg-type]
    assert rep.units == 250.0


def test_per_run_counts_a_run_name_once_in_each_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nextflow names runs at random (happy_euler): two namespaces' runs of one name are two runs."""
    data = fetched()
    data.runs[("shop", "p1")] = ("happy_euler", "FASTQC")  # wf/p2 is happy_euler too
    monkeypatch.setattr(report_cli, "fetch", lambda *a: data)
    ns = report_cli._parser().parse_args(["--namespace", "shop", "--start", str(T0), "--end", str(T0 + 180), "--per", "run"])
    assert report_cli.run(ns, Recorded(), T0).units == 2  # type: ignore[arg-type]


def test_a_step_of_two_weeks_is_written_as_promql_reads_it() -> None:
    prom = Recorded()
    ns = report_cli._parser().parse_args(
        ["--namespace", "shop", "--start", "2022-01-01T00:00:00Z", "--end", "2022-12-31T00:00:00Z", "--step", "2w"]
    )
    with pytest.raises(ReportError, match="no pod energy"):  # this Prometheus has none
        report_cli.run(ns, prom, T0)  # type: ignore[arg-type]
    assert any("[1209600s]" in q for q in prom.queries) and not any("e+" in q for q in prom.queries)
    assert (query.duration(1_209_600.0), query.duration(60.0), query.duration(1.5)) == ("1209600s", "60s", "1500ms")


def test_tenant_mode_asks_for_the_pods_nodes_in_ranges_prometheus_answers() -> None:
    """--tenant --last 8d at the 60 s step is 11,520 steps: asked in ranges of at most 10,000."""
    from joulesched.impact import tenant

    prom = Recorded()
    steps = T0 + 60.0 * np.arange(1, 8 * 1440 + 1)
    assert tenant._cpu_seconds(prom, {"vm-a": "SRV-1"}, steps, 60.0, T0, []) == {}  # type: ignore[arg-type]
    assert [(first, last) for first, last, _ in prom.steps] == [
        (steps[0], steps[9_999]),
        (steps[10_000], steps[-1]),
    ]
