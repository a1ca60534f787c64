"""``joulesched sim``: a wrong flag is one line naming it, exit 2, before any work (no traceback,
no NaN written to a trace, no flag silently ignored)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from joulesched.cli import main as joulesched

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "sim" / "data" / "clusters" / "example.yaml"
SMALL = ROOT / "sim" / "data" / "workflows" / "methylseq-dirt02-001.json"


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case here is refused before any work: a simulation, a replay or the demo fails the test."""
    import joulesched.sim.demo
    import joulesched.sim.execute
    import joulesched.sim.kubereplay

    for module, name in (
        (joulesched.sim.execute, "execute"),
        (joulesched.sim.kubereplay, "replay"),
        (joulesched.sim.demo, "run_demo"),
    ):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("the command ran instead of refusing its flags"))


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


# -- generate ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["workflow", "--tasks", "40", "--makespan", "nan"], "--makespan: must be a finite number > 0, got nan"),
        (["workflow", "--tasks", "40", "--makespan", "inf"], "--makespan: must be a finite number > 0, got inf"),
        (["workflow", "--tasks", "40", "--makespan", "-1"], "--makespan: must be a finite number > 0, got -1"),
        (["workflow", "--tasks", "0", "--makespan", "60"], "--tasks: must be 1 or more, got 0"),
        (["workflow", "--tasks", "4", "--makespan", "60", "--layers", "0"], "--layers: must be 1 or more, got 0"),
        (
            ["workflow", "--tasks", "4", "--makespan", "60", "--cores", "4,2"],
            "--cores: must be MIN,MAX whole cores with 1 <= MIN <= MAX, got '4,2'",
        ),
        (["workflow", "--tasks", "4", "--makespan", "60", "--seed", "-1"], "--seed: must be 0 or more, got -1"),
        (
            ["workflow", "--shape", "quantms-shape", "--tasks", "5"],
            "--tasks: not with --shape (the shape sets tasks, makespan, layers, cores)",
        ),
        (
            ["workflow", "--shape", "quantms-shape", "--makespan", "60"],
            "--makespan: not with --shape (the shape sets tasks, makespan, layers, cores)",
        ),
        (
            ["workflow", "--shape", "quantms-shape", "--layers", "5"],
            "--layers: not with --shape (the shape sets tasks, makespan, layers, cores)",
        ),
        (
            ["workflow", "--shape", "quantms-shape", "--cores", "1,4"],
            "--cores: not with --shape (the shape sets tasks, makespan, layers, cores)",
        ),
        (
            ["pods", "--count", "10", "--cluster-cores", "64", "--mean-duration", "nan"],
            "--mean-duration: must be a finite number > 0, got nan",
        ),
        (
            ["pods", "--count", "10", "--cluster-cores", "64", "--mean-duration", "-3"],
            "--mean-duration: must be a finite number > 0, got -3",
        ),
        (["pods", "--count", "10", "--cluster-cores", "nan"], "--cluster-cores: must be a finite number > 0, got nan"),
        (["pods", "--count", "10", "--cluster-cores", "inf"], "--cluster-cores: must be a finite number > 0, got inf"),
        (
            ["pods", "--count", "10", "--cluster-cores", "64", "--utilisation", "nan"],
            "--utilisation: must be a finite number > 0 and <= 1, got nan",
        ),
        (["pods", "--count", "0", "--cluster-cores", "64"], "--count: must be 1 or more, got 0"),
        (["pods", "--count", "10", "--cluster-cores", "64", "--seed", "-1"], "--seed: must be 0 or more, got -1"),
    ],
)
def test_generate_refuses_a_wrong_number_by_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    out = tmp_path / "out"
    assert joulesched(["sim", "generate", *argv, "--out", str(out)]) == 2
    assert one_line_error(capsys) == f"joulesched sim: {message}"
    assert not out.exists()


def test_generate_writes_finite_values_only(tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    assert joulesched(["sim", "generate", "workflow", "--tasks", "12", "--makespan", "60", "--out", str(out)]) == 0
    tasks = json.loads(out.read_text(encoding="utf-8"))["workflow"]["execution"]["tasks"]
    assert len(tasks) == 12 and all(t["runtimeInSeconds"] > 0 for t in tasks)


@pytest.mark.parametrize(
    "kind", [["workflow", "--shape", "quantms-shape"], ["pods", "--count", "3", "--cluster-cores", "8"]]
)
def test_generate_into_a_missing_folder_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: list[str]
) -> None:
    out = tmp_path / "nonexist" / "x.out"
    assert joulesched(["sim", "generate", *kind, "--out", str(out)]) == 2
    assert one_line_error(capsys) == f"joulesched sim: --out {out}: cannot write: No such file or directory"


def test_profiles_into_a_missing_folder_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nonexist" / "p.json"
    assert joulesched(["sim", "profiles", "--cluster", str(EXAMPLE), "--out", str(out)]) == 2
    assert one_line_error(capsys) == f"joulesched sim: --out {out}: cannot write: No such file or directory"


# -- run -----------------------------------------------------------------------------------------


def run(tmp_path: Path, *extra: str, out: Path | None = None) -> list[str]:
    target = out if out is not None else tmp_path / "report"
    return [
        "sim",
        "run",
        "--trace",
        str(SMALL),
        "--cluster",
        str(EXAMPLE),
        "--out",
        str(target),
        "--policies",
        "default",
        *extra,
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seed", "-1"], "--seed: must be 0 or more, got -1"),
        (["--repeat", "2", "--every", "nan"], "--every: must be a finite number >= 0, got nan"),
        (["--repeat", "2", "--every", "inf"], "--every: must be a finite number >= 0, got inf"),
        (["--repeat", "2", "--every", "-5"], "--every: must be a finite number >= 0, got -5"),
        (["--time-scale", "2"], "--time-scale: only with --scheduler kube"),
        (["--bind-timeout", "2"], "--bind-timeout: only with --scheduler kube"),
        (["--scheduler-name", "mine"], "--scheduler-name: only with --scheduler kube"),
        (["--kubeconfig", "k"], "--kubeconfig: only with --scheduler kube"),
    ],
)
def test_run_refuses_a_wrong_flag_before_simulating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert joulesched(run(tmp_path, *extra)) == 2
    assert one_line_error(capsys) == f"joulesched sim: {message}"
    assert not (tmp_path / "report").exists()


def test_run_into_a_file_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("", encoding="utf-8")
    assert joulesched(run(tmp_path, out=afile)) == 2
    assert one_line_error(capsys) == f"joulesched sim: --out {afile}: is a file, not a folder"
    assert joulesched(run(tmp_path, out=afile / "sub")) == 2
    assert one_line_error(capsys) == f"joulesched sim: --out {afile / 'sub'}: {afile} is a file, not a folder"


def test_demo_refuses_a_negative_seed_and_a_file_for_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert joulesched(["sim", "demo", "--seed", "-1", "--out", str(tmp_path / "d")]) == 2
    assert one_line_error(capsys) == "joulesched sim: --seed: must be 0 or more, got -1"
    afile = tmp_path / "afile"
    afile.write_text("", encoding="utf-8")
    assert joulesched(["sim", "demo", "--out", str(afile)]) == 2
    assert one_line_error(capsys) == f"joulesched sim: --out {afile}: is a file, not a folder"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seed", "-1"], "--seed: must be 0 or more, got -1"),
        (["--repeat", "2", "--every", "nan"], "--every: must be a finite number >= 0, got nan"),
        (["--time-scale", "nan"], "--time-scale: must be a finite number >= 0, got nan"),
        (["--bind-timeout", "nan"], "--bind-timeout: must be a finite number > 0, got nan"),
        (["--bind-timeout", "0"], "--bind-timeout: must be a finite number > 0, got 0"),
        (["--no-plots"], "--no-plots: not used with --scheduler kube"),
        (["--no-attribution"], "--no-attribution: not used with --scheduler kube"),
        (["--percentage-of-nodes-to-score", "0"], "--percentage-of-nodes-to-score: not used with --scheduler kube"),
        (["--extender-weight", "5"], "--extender-weight: not used with --scheduler kube"),
    ],
)
def test_run_kube_refuses_a_wrong_flag_before_replaying(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    argv = [
        "sim",
        "run",
        "--scheduler",
        "kube",
        "--trace",
        str(SMALL),
        "--cluster",
        str(EXAMPLE),
        "--out",
        str(tmp_path / "o"),
        *extra,
    ]
    assert joulesched(argv) == 2
    assert one_line_error(capsys) == f"joulesched sim: {message}"


def test_run_kube_into_a_file_is_refused_before_replaying(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("", encoding="utf-8")
    argv = ["sim", "run", "--scheduler", "kube", "--trace", str(SMALL), "--cluster", str(EXAMPLE), "--out", str(afile)]
    assert joulesched(argv) == 2
    assert one_line_error(capsys) == f"joulesched sim: --out {afile}: is a file, not a folder"
