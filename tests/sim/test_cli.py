"""``joulesched sim``: the report folder, errors a user can act on, the generator, the demo."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from joulesched.cli import main as joulesched
from joulesched.policy.profile import parse_profiles
from joulesched.sim.progress import Progress
from joulesched.sim.recording import read_recordings, replay_samples

ROOT = Path(__file__).parents[2]
FIXTURES = Path(__file__).with_name("fixtures")
EXAMPLE = ROOT / "sim" / "data" / "clusters" / "example.yaml"
SMALL = ROOT / "sim" / "data" / "workflows" / "methylseq-dirt02-001.json"


def test_run_writes_results_report_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    code = joulesched(["sim", "run", "--trace", str(SMALL), str(FIXTURES / "nextflow-rnaseq-trace.txt"), "--cluster", str(EXAMPLE), "--seed", "2", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "default" in printed and "carbon" in printed and "target energy" in printed
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    for policy in ("default", "most-allocated", "energy", "carbon"):
        m = results["policies"][policy]
        for key in ("energy_joules", "carbon_grams", "makespan_seconds", "mean_pending_seconds", "pods", "facility_energy_joules", "water_litres"):
            assert key in m
        assert m["pods"] == 36 + 6
    assert "reason" in results["percentage_100"]  # 20 nodes: the same with either setting
    att = results["attribution"]["workflows"]
    assert set(att) == {"methylseq-dirt02-001", "nextflow-rnaseq-trace"}
    assert set(att["methylseq-dirt02-001"]["methods"]) >= {"counter_edges", "cpu_share", "pod_increase_30s", "pod_sum_over_time_15s", "node_increase_30s"}
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "## Summary" in report and "## Attribution" in report and "## Targets" in report
    # Each target's figures against default and against bin-packing, on screen and in the report.
    energy = results["targets"]["energy"]
    line = next(t for t in printed.splitlines() if t.startswith("target energy:"))
    assert line.endswith(
        f"({energy['energy_saving_percent']:.1f} % less than default, "
        f"{energy['energy_saving_vs_most_allocated_percent']:.1f} % less than most-allocated)"
    ), line
    assert f"({energy['energy_saving_vs_most_allocated_percent']:.1f} % less than `most-allocated`)" in report
    for png in ("energy_carbon.png", "cluster_power.png", "node_utilisation.png", "attribution_error.png", "attribution_scrapes.png"):
        assert (out / png).stat().st_size > 1000, png


def test_a_malformed_trace_is_a_message_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "pods.csv"
    bad.write_text("name,arrival,duration,cpu_request\nx,0,10,two\n", encoding="utf-8")
    assert joulesched(["sim", "run", "--trace", str(bad), "--cluster", str(EXAMPLE), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: line 2 (pod 'x'): field 'cpu_request'" in err


def test_a_broken_cluster_lists_its_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("sites: {a: {pue: 0.5}}\nnode_types: [{name: t, count: 1, site: a, cores: 0, memory: 1Gi}]\n", encoding="utf-8")
    assert joulesched(["sim", "run", "--trace", str(SMALL), "--cluster", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "sites.a.pue: must be >= 1" in err and "node_types[0].cores: must be > 0" in err


def test_unknown_policy_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = joulesched(["sim", "run", "--trace", str(SMALL), "--cluster", str(EXAMPLE), "--policies", "default,fastest", "--out", str(tmp_path)])
    assert code == 2 and "'fastest'" in capsys.readouterr().err


def test_generate_and_profiles(tmp_path: Path) -> None:
    assert joulesched(["sim", "generate", "workflow", "--shape", "quantms-shape", "--out", str(tmp_path / "q.json")]) == 0
    assert joulesched(["sim", "generate", "workflow", "--tasks", "20", "--makespan", "60", "--out", str(tmp_path / "w.json")]) == 0
    assert joulesched(["sim", "generate", "pods", "--count", "30", "--cluster-cores", "64", "--out", str(tmp_path / "p.csv")]) == 0
    assert len((tmp_path / "p.csv").read_text(encoding="utf-8").splitlines()) == 31
    assert joulesched(["sim", "profiles", "--cluster", str(EXAMPLE), "--out", str(tmp_path / "nodes.json")]) == 0
    profiles = parse_profiles(json.loads((tmp_path / "nodes.json").read_text(encoding="utf-8")), "nodes.json")
    assert len(profiles.nodes) == 20 and set(profiles.sites) == {"bpat-hydro", "ciso-mixed", "miso-coal"}


def test_an_agent_recording_replays_its_measured_energy() -> None:
    intervals = read_recordings([FIXTURES / "agent-recording-lin-000.jsonl"])
    assert intervals == [(1764400000.0, "lin-000", 1764400010.0, 120.0), (1764400010.0, "lin-000", 1764400020.0, 150.0)]
    samples = replay_samples(intervals, ["lin-000", "lin-001"])
    assert samples[0] == (0.0, 0, 120.0) and samples[1] == (10.0, 0, 150.0)
    assert samples[2][0] == 20.0 and samples[2][2] != samples[2][2]  # NaN: back to the model


def test_a_recording_of_an_unknown_node_is_named() -> None:
    from joulesched.sim.errors import TraceError

    with pytest.raises(TraceError, match="lin-000"):
        replay_samples(read_recordings([FIXTURES / "agent-recording-lin-000.jsonl"]), ["other-000"])


def test_progress_is_silent_off_a_terminal_for_short_runs() -> None:
    stream = io.StringIO()
    progress = Progress(stream, tty=False)
    progress("default", 0.5)
    progress("default", 1.0)
    progress.done()
    assert stream.getvalue() == ""
    tty = io.StringIO()
    bar = Progress(tty, tty=True)
    bar("energy", 1.0)
    bar.done()
    assert "energy" in tty.getvalue() and "100.0%" in tty.getvalue()


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    assert joulesched(["sim", "demo", "--out", str(tmp_path / "demo")]) == 0
    results = json.loads((tmp_path / "demo" / "results.json").read_text(encoding="utf-8"))
    assert {"energy", "carbon"} <= set(results["targets"])
    assert {"quantms-shape", "rangeland-shape", "rnaseq-shape"} <= set(results["attribution"]["workflows"])
    assert results["sensitivity"]["no_autoscaler"]["policies"]["default"]["pods"] == results["policies"]["default"]["pods"]
    # The targets are checked with the autoscaler off too, and reported.
    assert {"energy", "carbon"} <= set(results["sensitivity"]["no_autoscaler"]["targets"])
    report = (tmp_path / "demo" / "report.md").read_text(encoding="utf-8")
    assert "## Targets (every node powered all the time (autoscaler off))" in report
