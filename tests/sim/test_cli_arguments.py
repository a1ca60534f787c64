"""``joulesched sim``: a wrong flag is refused by name, exit 2, before any work (no traceback,
no NaN written to a trace, no flag silently ignored): one line of its own, or, for a number out
of its bounds, argparse's usage and its error line (``contracts.cliargs``)."""

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


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What the command said refusing ``argv`` (exit 2): argparse's error, or its own one line."""
    try:
        code = joulesched(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    lines = err.splitlines()
    if ": error: argument " in lines[-1]:
        assert lines[0].startswith("usage: joulesched sim"), err
        return lines[-1].split(": error: ", 1)[1]
    assert len(lines) == 1, err
    return lines[0].removeprefix("joulesched sim: ")


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


# -- generate ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["workflow", "--tasks", "40", "--makespan", "nan"], "argument --makespan: must be a finite number > 0 seconds, got 'nan'"),
        (["workflow", "--tasks", "40", "--makespan", "inf"], "argument --makespan: must be a finite number > 0 seconds, got 'inf'"),
        (["workflow", "--tasks", "40", "--makespan", "-1"], "argument --makespan: must be a finite number > 0 seconds, got '-1'"),
        (["workflow", "--tasks", "0", "--makespan", "60"], "argument --tasks: must be a whole number >= 1, got '0'"),
        (["workflow", "--tasks", "4", "--makespan", "60", "--layers", "0"], "argument --layers: must be a whole number >= 1, got '0'"),
        (
            ["workflow", "--tasks", "4", "--makespan", "60", "--cores", "4,2"],
            "--cores: must be MIN,MAX whole cores with 1 <= MIN <= MAX, got '4,2'",
        ),
        (["workflow", "--tasks", "4", "--makespan", "60", "--seed", "-1"], "argument --seed: must be a whole number >= 0, got '-1'"),
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
            "argument --mean-duration: must be a finite number > 0 seconds, got 'nan'",
        ),
        (
            ["pods", "--count", "10", "--cluster-cores", "64", "--mean-duration", "-3"],
            "argument --mean-duration: must be a finite number > 0 seconds, got '-3'",
        ),
        (["pods", "--count", "10", "--cluster-cores", "nan"], "argument --cluster-cores: must be a finite number > 0, got 'nan'"),
        (["pods", "--count", "10", "--cluster-cores", "inf"], "argument --cluster-cores: must be a finite number > 0, got 'inf'"),
        (
            ["pods", "--count", "10", "--cluster-cores", "64", "--utilisation", "nan"],
            "argument --utilisation: must be a finite number > 0 and <= 1, got 'nan'",
        ),
        (["pods", "--count", "0", "--cluster-cores", "64"], "argument --count: must be a whole number >= 1, got '0'"),
        (["pods", "--count", "10", "--cluster-cores", "64", "--seed", "-1"], "argument --seed: must be a whole number >= 0, got '-1'"),
    ],
)
def test_generate_refuses_a_wrong_number_by_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    out = tmp_path / "out"
    assert refusal(["sim", "generate", *argv, "--out", str(out)], capsys) == message
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
        (["--seed", "-1"], "argument --seed: must be a whole number >= 0, got '-1'"),
        (["--repeat", "2", "--every", "nan"], "argument --every: must be a finite number >= 0 seconds, got 'nan'"),
        (["--repeat", "2", "--every", "inf"], "argument --every: must be a finite number >= 0 seconds, got 'inf'"),
        (["--repeat", "2", "--every", "-5"], "argument --every: must be a finite number >= 0 seconds, got '-5'"),
        (["--repeat", "0"], "argument --repeat: must be a whole number >= 1, got '0'"),
        (["--repeat", "1.5"], "argument --repeat: must be a whole number >= 1, got '1.5'"),
        (
            ["--percentage-of-nodes-to-score", "101"],
            "argument --percentage-of-nodes-to-score: must be a whole number >= 0 and <= 100, got '101'",
        ),
        (["--extender-weight", "0"], "argument --extender-weight: must be a whole number >= 1, got '0'"),
        (["--time-scale", "2"], "--time-scale: only with --scheduler kube"),
        (["--bind-timeout", "2"], "--bind-timeout: only with --scheduler kube"),
        (["--scheduler-name", "mine"], "--scheduler-name: only with --scheduler kube"),
        (["--kubeconfig", "k"], "--kubeconfig: only with --scheduler kube"),
    ],
)
def test_run_refuses_a_wrong_flag_before_simulating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert refusal(run(tmp_path, *extra), capsys) == message
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
    assert refusal(["sim", "demo", "--seed", "-1", "--out", str(tmp_path / "d")], capsys) == (
        "argument --seed: must be a whole number >= 0, got '-1'"
    )
    afile = tmp_path / "afile"
    afile.write_text("", encoding="utf-8")
    assert joulesched(["sim", "demo", "--out", str(afile)]) == 2
    assert one_line_error(capsys) == f"joulesched sim: --out {afile}: is a file, not a folder"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seed", "-1"], "argument --seed: must be a whole number >= 0, got '-1'"),
        (["--repeat", "2", "--every", "nan"], "argument --every: must be a finite number >= 0 seconds, got 'nan'"),
        (["--time-scale", "nan"], "argument --time-scale: must be a finite number >= 0, got 'nan'"),
        (["--time-scale", "-1"], "argument --time-scale: must be a finite number >= 0, got '-1'"),
        (["--bind-timeout", "nan"], "argument --bind-timeout: must be a finite number > 0 seconds, got 'nan'"),
        (["--bind-timeout", "0"], "argument --bind-timeout: must be a finite number > 0 seconds, got '0'"),
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
    assert refusal(argv, capsys) == message


def test_run_kube_into_a_file_is_refused_before_replaying(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("", encoding="utf-8")
    argv = ["sim", "run", "--scheduler", "kube", "--trace", str(SMALL), "--cluster", str(EXAMPLE), "--out", str(afile)]
    assert joulesched(argv) == 2
    assert one_line_error(capsys) == f"joulesched sim: --out {afile}: is a file, not a folder"


def test_demo_help_says_where_the_report_goes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        joulesched(["sim", "demo", "--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help to the terminal
    assert "--out DIR report folder (created; default: sim-demo)" in out


def test_a_policy_config_giving_a_key_twice_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from joulesched.policy.errors import ConfigError
    from joulesched.sim.cli import load_policy

    path = tmp_path / "policy.yaml"
    path.write_text("policy:\n  band: 1\n  band: 2\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_policy(str(path))
    assert caught.value.problems == ["policy.band: given twice in one mapping, at line 2 and again at line 3 (a key appears once)"]
