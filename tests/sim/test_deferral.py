"""Carbon-aware deferral in the simulator (sim/deferral.py): held work, released by policy.deferral.decide."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from joulesched.cli import main as joulesched
from joulesched.sim.engine import Engine, EngineOptions, Profile
from joulesched.sim.errors import SimError, TraceError
from joulesched.sim.model import Trace, Workload
from joulesched.sim.runner import RunOptions, check_policies, run_policies
from joulesched.sim.traces import read_pod_csv
from tests.sim.support import cluster, node_type, pod, workload

H = 3600.0
ROOT = Path(__file__).parents[2]
SMALL = ROOT / "sim" / "data" / "workflows" / "methylseq-dirt02-001.json"


def hourly_site(tmp_path: Path, values: list[float], name: str = "a", pue: float = 1.0) -> dict[str, Any]:
    """A site whose series (one day from the cluster's start, repeating) has these hourly values."""
    lines = ["timestamp,avg_CI"] + [f"2022-06-01 {h:02d}:00:00+00:00,{v}" for h, v in enumerate(values)]
    path = tmp_path / f"{name}.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"pue": pue, "carbon_series": {"file": str(path), "column": "avg_CI"}}


def chain(name: str, durations: list[float], arrival: float = 0.0, max_delay: float | None = 12 * H) -> Trace:
    """A workflow of tasks run one after another (each 1 core)."""
    pods = [
        pod(f"{name}-{k}", d, 1.0, arrival=arrival, parents=(k - 1,) if k else (), workflow=name, max_delay=max_delay)
        for k, d in enumerate(durations)
    ]
    return Trace(name, "test", "synthetic", tuple(pods))


def example_run(out: Path) -> list[str]:
    """``joulesched sim run`` of one small nf-core trace on the example cluster."""
    return [
        "sim",
        "run",
        "--trace",
        str(SMALL),
        "--cluster",
        str(ROOT / "sim/data/clusters/example.yaml"),
        "--out",
        str(out),
    ]


def run(cl: Any, wl: Workload, *names: str) -> dict[str, Any]:
    return run_policies(cl, wl, RunOptions(policies=names, record_timeseries=False))


def test_release_lands_in_the_clean_hour(tmp_path: Path) -> None:
    day = [300.0] * 24
    day[5] = 100.0  # the one clean hour
    cl = cluster(node_type("n", 2), sites={"a": hourly_site(tmp_path, day)})
    wl = Workload.of([chain("wf", [600.0, 600.0], arrival=0.5 * H)])
    runs = run(cl, wl, "default", "default+defer:perfect")
    d = runs["default+defer:perfect"].result.deferral
    assert d is not None
    assert d.released.tolist() == [5 * H] and d.reasons == ["clean"]
    starts = runs["default+defer:perfect"].result.pods.start
    assert starts[0] == 5 * H and starts[1] == 5 * H + 600.0
    m = runs["default+defer:perfect"].metrics
    assert m["deferral"]["extra_pending_mean_seconds"] == pytest.approx(4.5 * H)
    assert m["deferral"]["deadlines_missed"] == 0
    assert m["carbon_grams"] < runs["default"].metrics["carbon_grams"]


def test_a_flat_series_changes_nothing(tmp_path: Path) -> None:
    cl = cluster(node_type("n", 2), sites={"a": hourly_site(tmp_path, [250.0] * 24)})
    wl = Workload.of([chain("a", [300.0, 200.0], arrival=100.0), chain("b", [900.0], arrival=2 * H)])
    runs = run(cl, wl, "default", "default+defer:perfect", "default+defer:day-ahead")
    base = runs["default"]
    for name in ("default+defer:perfect", "default+defer:day-ahead"):
        r = runs[name]
        assert r.result.deferral is not None and set(r.result.deferral.reasons) == {"clean"}
        assert np.array_equal(r.result.pods.start, base.result.pods.start)
        assert r.metrics["carbon_grams"] == base.metrics["carbon_grams"]
        assert r.metrics["energy_joules"] == base.metrics["energy_joules"]
        assert r.metrics["deferral"]["extra_pending_mean_seconds"] == 0.0


@pytest.mark.parametrize("forecast", ["perfect", "persistence", "day-ahead"])
def test_deferred_runs_never_miss_a_deadline(tmp_path: Path, forecast: str) -> None:
    # Falling all day: the cleanest start is always the latest one, so every release is the
    # deadline release, the tightest case; 10 workflows on a small cluster.
    day = [500.0 - 20.0 * h for h in range(24)]
    cl = cluster(node_type("n", 2, cores=4), sites={"a": hourly_site(tmp_path, day)})
    wl = Workload.of([chain(f"wf{k}", [400.0, 300.0, 500.0], arrival=k * 1800.0, max_delay=6 * H) for k in range(10)])
    r = run(cl, wl, f"default+defer:{forecast}")[f"default+defer:{forecast}"]
    d = r.result.deferral
    assert d is not None and len(d.names) == 10
    assert np.all(d.released <= d.deadline - d.runtime + 1e-6)
    assert np.all(d.finished <= d.deadline)
    assert r.metrics["deferral"]["deadlines_missed"] == 0
    if forecast == "perfect":
        assert np.all(d.released > d.submitted)  # every one held for the cleaner later hours


def test_a_realistic_forecast_plans_with_yesterday(tmp_path: Path) -> None:
    # Day 1 is clean at 05:00, day 2 at 10:00 (the series is two days, repeating). Submitted at
    # 02:00 on day 2, persistence expects 05:00 (yesterday's pattern): it cannot know of 10:00.
    days = [300.0] * 48
    days[5], days[24 + 10] = 100.0, 100.0
    lines = ["timestamp,avg_CI"] + [
        f"2022-06-{1 + h // 24:02d} {h % 24:02d}:00:00+00:00,{v}" for h, v in enumerate(days)
    ]
    (tmp_path / "two.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cl = cluster(node_type("n", 1), sites={"a": {"pue": 1.0, "carbon_series": {"file": str(tmp_path / "two.csv")}}})
    wl = Workload.of([chain("wf", [600.0], arrival=26 * H)])
    runs = run(cl, wl, "default+defer:perfect", "default+defer:persistence")
    perfect = runs["default+defer:perfect"].result.deferral
    persistence = runs["default+defer:persistence"].result.deferral
    assert perfect is not None and persistence is not None
    assert perfect.released.tolist() == [34 * H]
    # at 05:00 the hour in force (300) is known to be no better than yesterday's 300s ahead
    assert persistence.released[0] == 29 * H


def test_lowest_of_two_sites_and_carbon_placement(tmp_path: Path) -> None:
    a = [300.0] * 24
    b = [400.0] * 24
    b[3] = 50.0  # only site b is ever clean, at 03:00
    cl = cluster(
        node_type("na", 1, site="a"),
        node_type("nb", 1, site="b"),
        sites={"a": hourly_site(tmp_path, a, "a"), "b": hourly_site(tmp_path, b, "b")},
    )
    wl = Workload.of([chain("wf", [600.0])])
    r = run(cl, wl, "carbon+defer:perfect")["carbon+defer:perfect"]
    assert r.result.deferral is not None and r.result.deferral.released.tolist() == [3 * H]
    assert r.result.nodes[int(r.result.pods.node[0])].site == "b"


def test_not_deferrable_work_is_not_held(tmp_path: Path) -> None:
    day = [300.0] * 24
    day[5] = 100.0
    cl = cluster(node_type("n", 1), sites={"a": hourly_site(tmp_path, day)})
    wl = Workload.of([chain("wf", [600.0], max_delay=None)])
    engine = Engine(
        cl, wl, Profile("default+defer:perfect", "least", defer=_how()), EngineOptions(record_timeseries=False)
    )
    result = engine.run()
    assert result.pods.start.tolist() == [0.0]
    assert result.deferral is not None and result.deferral.names == []


def _how() -> Any:
    from joulesched.sim.deferral import Deferring

    return Deferring("perfect")


def test_a_missed_deadline_is_counted_and_fails_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One core, two 1-core pods of 1,000 s, each to be done within 1,200 s: the second cannot be.
    csv = tmp_path / "pods.csv"
    csv.write_text(
        "name,arrival,duration,cpu_request,max_delay\np1,0,1000,1,1200\np2,0,1000,1,1200\n", encoding="utf-8"
    )
    spec = tmp_path / "cluster.yaml"
    spec.write_text(
        "start: 2022-06-01T00:00:00Z\nsites: {a: {pue: 1.0, carbon_intensity: 100}}\n"
        "node_types: [{name: n, count: 1, site: a, cores: 1, memory: 4Gi, idle_watts: 10, watts_per_core: 10}]\n",
        encoding="utf-8",
    )
    out = tmp_path / "report"
    code = joulesched(
        [
            "sim",
            "run",
            "--trace",
            str(csv),
            "--cluster",
            str(spec),
            "--policies",
            "default+defer",
            "--out",
            str(out),
            "--no-plots",
        ]
    )
    assert code == 1
    assert "DEADLINES MISSED: 1" in capsys.readouterr().err
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["deadlines_missed"] == 1
    assert results["policies"]["default+defer:perfect"]["deferral"]["missed_units"] == ["p2"]
    assert "DEADLINES MISSED" in (out / "report.md").read_text(encoding="utf-8")


def test_cli_deadline_runs_each_policy_with_and_without_deferral(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    code = joulesched(
        [*example_run(out), "--deadline", "12h", "--forecast", "perfect,day-ahead", "--no-plots", "--no-attribution"]
    )
    assert code == 0
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert set(results["policies"]) == {
        *(p for p in ("default", "most-allocated", "energy", "carbon")),
        *(
            f"{p}+defer:{f}"
            for p in ("default", "most-allocated", "energy", "carbon")
            for f in ("perfect", "day-ahead")
        ),
    }
    assert set(results["deferral"]) == {n for n in results["policies"] if "+defer" in n}
    assert results["deadlines_missed"] == 0
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "## Carbon-aware deferral" in report and "carbon+defer:day-ahead" in report
    assert "deferral carbon+defer:perfect" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--deadline", "12x"], "--deadline: must be a duration"),
        (["--deadline", "0"], "--deadline: must be more than 0"),
        (["--deadline=-3h"], "--deadline: must be a duration"),
        (["--deadline", "40d"], "at most 31 days"),
        (
            ["--deadline", "12h", "--forecast", "tomorrow"],
            "--forecast: must be one or more of perfect, persistence, day-ahead",
        ),
        (["--deadline", "12h", "--forecast", ""], "--forecast"),
        (["--forecast", "perfect"], "--forecast: no policy defers"),
        (["--deadline", "12h", "--policies", "carbon"], "--deadline: no policy in --policies defers"),
        (["--policies", "carbon+defer"], "needs deferrable work"),
        (["--policies", "carbon+defer:oracle"], "unknown forecast 'oracle'"),
    ],
)
def test_cli_rejects_malformed_deferral_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert joulesched([*example_run(tmp_path / "r"), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_pod_csv_max_delay_column(tmp_path: Path) -> None:
    good = tmp_path / "good.csv"
    good.write_text("name,arrival,duration,max_delay\na,0,10,3600\nb,0,10,\n", encoding="utf-8")
    trace = read_pod_csv(good)
    assert [p.max_delay for p in trace.pods] == [3600.0, None]
    bad = tmp_path / "bad.csv"
    bad.write_text("name,arrival,duration,max_delay\na,0,10,soon\n", encoding="utf-8")
    with pytest.raises(TraceError, match="max_delay"):
        read_pod_csv(bad)


def test_policy_names() -> None:
    assert check_policies(["carbon+defer:persistence", "carbon+most-allocated+defer:day-ahead"]) == (
        "carbon+defer:persistence",
        "carbon+most-allocated+defer:day-ahead",
    )
    with pytest.raises(SimError, match="unknown policy"):
        check_policies(["carbon:perfect"])
    with pytest.raises(SimError, match="unknown policy"):
        check_policies(["green+defer"])


def test_the_simple_workload_helper_still_defers(tmp_path: Path) -> None:
    # independent pods are units of their own
    day = [300.0] * 24
    day[2] = 50.0
    cl = cluster(node_type("n", 1), sites={"a": hourly_site(tmp_path, day)})
    wl = workload(pod("p", 60.0, max_delay=6 * H), pod("q", 60.0))
    r = run(cl, wl, "default+defer:perfect")["default+defer:perfect"]
    assert r.result.pods.start.tolist() == [2 * H, 0.0]
