"""``joulesched weblog-report``: a saved result that cannot be read is named with its file, exit 2;
flags that do not apply are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from joulesched.measurement import weblog_report


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"", "not valid JSON: Expecting value: line 1 column 1 (char 0)"),
        (b"\xff\xfe", "not valid JSON: "),
        (b'{"a":', "not valid JSON: "),
        (b"[]", "not a saved answer of GET /v1/weblog/{runId} (a JSON object), got list"),
        (b"{}", "not a finished run's result (no run/task_rows): is the run still open?"),
        (b'{"run": {}, "task_rows": [], "processes": []}', "not a finished run's result: no key 'joules'"),
    ],
    ids=["empty", "binary", "truncated", "a list", "an empty object", "a partial result"],
)
def test_a_saved_result_that_is_not_one_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, said: str
) -> None:
    saved = tmp_path / "run.json"
    saved.write_bytes(content)
    assert weblog_report.main(["--json", str(saved), "-o", str(tmp_path / "run.html")]) == 2
    assert one_line(capsys).startswith(f"joulesched weblog-report: --json {saved}: {said}")
    assert not (tmp_path / "run.html").exists()


def test_a_missing_saved_result_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nonexist.json"
    assert weblog_report.main(["--json", str(missing), "-o", str(tmp_path / "run.html")]) == 2
    assert one_line(capsys) == f"joulesched weblog-report: --json {missing}: cannot read: No such file or directory"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["--json", "x.json", "--intensity", "nan"],
            "argument --intensity: must be a finite number >= 0 and <= 5000 gCO2e/kWh, got 'nan'",
        ),
        (
            ["--json", "x.json", "--intensity", "-1"],
            "argument --intensity: must be a finite number >= 0 and <= 5000 gCO2e/kWh, got '-1'",
        ),
        (["--json", "x.json", "--run", "r1"], "argument --run: only with --agent (--json reads a saved result)"),
        (
            ["--json", "x.json", "--token-file", "t"],
            "argument --token-file: only with --agent (--json reads a saved result)",
        ),
        (["--agent", "http://127.0.0.1:9"], "argument --agent: needs --run RUN_ID"),
    ],
)
def test_flags_that_do_not_apply_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    with pytest.raises(SystemExit) as done:
        weblog_report.main([*argv, "-o", str(tmp_path / "run.html")])
    assert done.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"joulesched weblog-report: error: {said}"


@pytest.mark.parametrize(
    ("agent", "said"),
    [
        ("localhost:9102", "must be http://HOST:PORT or https://HOST:PORT, e.g. http://127.0.0.1:9102"),
        ("127.0.0.1:9102", "must be http://HOST:PORT or https://HOST:PORT, e.g. http://127.0.0.1:9102"),
        ("ftp://agent:9102", "must be http://HOST:PORT or https://HOST:PORT, e.g. http://127.0.0.1:9102"),
        ("http://:9102", "must be http://HOST:PORT or https://HOST:PORT, e.g. http://127.0.0.1:9102"),
        ("http://[::1", "not a URL (Invalid IPv6 URL); give http://HOST:PORT, e.g. http://127.0.0.1:9102"),
        ("http://agent:x", "not a URL (Port could not be cast to integer value as 'x'); give http://HOST:PORT"),
    ],
    ids=["no scheme", "an address and port", "not http", "no host", "a bad IPv6 literal", "a port that is no number"],
)
def test_an_agent_url_that_is_not_one_names_the_flag_before_anything_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], agent: str, said: str
) -> None:
    """Checked before the token file is read or the agent asked: exit 2 and one line naming
    --agent, as for the other bad flags (it was exit 1, "unknown url type" or a bare "Invalid IPv6 URL")."""
    argv = ["--agent", agent, "--run", "r1", "--token-file", str(tmp_path / "no-token"), "-o", str(tmp_path / "x.html")]
    assert weblog_report.main(argv) == 2
    assert one_line(capsys).startswith(f"joulesched weblog-report: --agent {agent}: {said}")
    assert not (tmp_path / "x.html").exists()


def test_an_agent_url_with_credentials_in_it_is_refused_without_repeating_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--agent", "http://me:SECRET@127.0.0.1:9", "--run", "r1", "-o", str(tmp_path / "x.html")]
    assert weblog_report.main(argv) == 2
    said = one_line(capsys)
    assert said.startswith("joulesched weblog-report: --agent http://127.0.0.1:9: must not carry credentials")
    assert said.endswith("remove them and use --token-file") and "SECRET" not in said
