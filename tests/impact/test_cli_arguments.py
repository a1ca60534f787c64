"""``joulesched report`` and ``joulesched rules``: a wrong flag is refused by name, exit 2, before
Prometheus is asked anything (no traceback, no flag silently ignored)."""

from __future__ import annotations

from pathlib import Path

import pytest

from joulesched import cli
from joulesched.impact import cli as report_cli
from joulesched.impact import rules

# Nothing listens there: a flag checked only after a query would read "Prometheus at ... ".
NOWHERE = ["--prometheus", "http://127.0.0.1:9", "--namespace", "shop", "--last", "1h"]
TENANT = ["--tenant", "--registrar", "http://127.0.0.1:9", "--influx", "http://127.0.0.1:9", "--database", "db"]
SECRET = Path(__file__).parent / "test_cli_arguments.py"  # any readable file: the check comes before any request


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main(["report", *argv])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Prometheus at" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_a_timeout_that_is_not_a_positive_number_is_refused_at_once(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    last = refused([*NOWHERE, "--timeout", value], capsys)
    assert (
        last
        == f"joulesched report: error: argument --timeout: must be a finite number > 0 seconds, got {value!r}"
    )


@pytest.mark.parametrize(
    "flag",
    [
        ["--intensity", "300"],
        ["--pue", "1.2"],
        ["--wue", "0.5"],
        ["--threads-per-core", "2"],
        ["--share", "provider"],
        ["--vm-share", "vm-a=0.1"],
        ["--registrar", "http://x"],
        ["--influx-user", "u"],
        ["--allow-plain-http"],
    ],
)
def test_tenant_flags_are_refused_in_prometheus_mode(flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    last = refused([*NOWHERE, *flag], capsys)
    assert last == (
        f"joulesched report: error: argument {flag[0]}: only with --tenant "
        "(Prometheus mode reads the site factors from Prometheus)"
    )


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--intensity", "nan"], "argument --intensity: must be a finite number >= 0 and <= 5000 gCO2e/kWh, got 'nan'"),
        (["--intensity", "-1"], "argument --intensity: must be a finite number >= 0 and <= 5000 gCO2e/kWh, got '-1'"),
        (["--pue", "0.9"], "argument --pue: must be a finite number >= 1, got '0.9'"),
        (["--pue", "inf"], "argument --pue: must be a finite number >= 1, got 'inf'"),
        (["--wue", "nan"], "argument --wue: must be a finite number >= 0 litres per kWh, got 'nan'"),
        (["--wue", "-0.5"], "argument --wue: must be a finite number >= 0 litres per kWh, got '-0.5'"),
        (["--threads-per-core", "0"], "argument --threads-per-core: must be a whole number >= 1, got '0'"),
    ],
)
def test_tenant_figures_are_checked_at_once(flag: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    last = refused([*TENANT, "--last", "1h", *flag], capsys)
    assert last == f"joulesched report: error: {message}"


def test_tenant_defaults_are_kept_when_the_flags_are_not_given() -> None:
    inputs = report_cli.tenant_inputs(report_cli.parse_args([*TENANT, "--last", "1h"]))
    assert (inputs.share, dict(inputs.vm_shares), inputs.threads_per_core) == ("vcpu", {}, 2)
    assert (inputs.intensity, inputs.pue, inputs.wue) == (None, 1.0, None)
    given = report_cli.parse_args([*TENANT, "--last", "1h", "--intensity", "300", "--pue", "1.2", "--wue", "0.4"])
    inputs = report_cli.tenant_inputs(given)
    assert (inputs.intensity, inputs.pue, inputs.wue) == (300.0, 1.2, 0.4)


def test_rules_into_a_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("", encoding="utf-8")
    for target, culprit in ((afile, afile), (afile / "sub", afile)):
        for check in ([], ["--check"]):
            assert rules.main([*check, "--output-dir", str(target)]) == 2
            err = capsys.readouterr().err
            assert "Traceback" not in err
            assert err == f"joulesched rules: --output-dir {target}: {culprit} is a file, not a folder\n"


def test_rules_into_a_folder_whose_subfolder_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "operator").write_text("", encoding="utf-8")
    assert rules.main(["--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"joulesched rules: --output-dir {tmp_path}: cannot write {tmp_path / 'operator' / 'prometheusrule.yaml'}: "
    )
    assert len(err.splitlines()) == 1


def test_rules_write_into_a_new_folder(tmp_path: Path) -> None:
    assert rules.main(["--output-dir", str(tmp_path / "new")]) == 0
    assert rules.main(["--check", "--output-dir", str(tmp_path / "new")]) == 0


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf"])
def test_a_number_of_requests_that_gives_no_sci_is_refused_before_any_query(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    last = refused([*NOWHERE, "--per", "request", "--requests", value], capsys)
    assert last == f"joulesched report: error: argument --requests: must be a finite number > 0, got {value!r}"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--last", "1h"], "give a scope: --namespace, --selector, --run or --owner"),
        (["-n", "shop"], "give the range: --start (and --end) or --last"),
        (["-n", "shop", "--last", "1h", "--start", "now-2h"], "give either --start or --last, not both"),
        (["-n", "shop", "--start", "now", "--end", "now-1h"], "--end ("),
        (["-n", "shop", "--start", "yesterday"], "'yesterday' is not a time"),
        (["-n", "shop", "--last", "1fortnight"], "'1fortnight' is not a duration"),
        (["-n", "shop", "--last", "1h", "--step", "1.5s"], "--step 1.5s: must be a whole number of seconds"),
        (["-n", "shop", "--last", "1h", "--per", "request"], "--per request needs --requests N or --requests-query PROMQL"),
        (
            ["-n", "shop", "--last", "1h", "--per", "request", "--requests", "5", "--requests-query", "x"],
            "give either --requests or --requests-query, not both",
        ),
        (["--tenant", "--last", "1h", "--registrar", "http://127.0.0.1:9"], "--tenant needs --influx, --database"),
        ([*TENANT, "--last", "1h", "--share", "provider", "--vm-share", "vm-a"], "--vm-share 'vm-a': give NODE=FRACTION"),
        ([*TENANT, "--last", "1h", "--registrar-token-file", "/nonexistent/t"], "--registrar-token-file /nonexistent/t: "),
        # a URL's user:password@ would be repeated in every error: refused, and not repeated
        (["-n", "shop", "--last", "1h", "--prometheus", "http://u:hunter2@127.0.0.1:9"], "--prometheus: must not carry credentials"),
        ([*TENANT, "--last", "1h", "--registrar", "http://u:hunter2@127.0.0.1:9"],
         "--registrar: must not carry credentials (user:password@ in the URL ends up in logs, errors and /metrics):"
         " remove them and use --registrar-token-file"),
        ([*TENANT, "--last", "1h", "--influx", "http://u:hunter2@127.0.0.1:9"], "--influx: must not carry credentials"),
        # a token or password over http:// off loopback, without --allow-plain-http
        ([*TENANT, "--last", "1h", "--registrar", "http://192.0.2.2:9", "--registrar-token-file", str(SECRET)],
         "--registrar: http:// would send the registrar token (--registrar-token-file) in cleartext to 192.0.2.2"),
        ([*TENANT, "--last", "1h", "--influx", "http://192.0.2.2:9", "--influx-password-file", str(SECRET)],
         "--influx: http:// would send the InfluxDB password (--influx-password-file) in cleartext to 192.0.2.2"),
    ],
)
def test_a_command_called_wrong_is_exit_2_before_any_query(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Prometheus (and the provider) at port 9 answer nothing: a query would be exit 1 naming it
    assert cli.main(["report", "--prometheus", "http://127.0.0.1:9", "--timeout", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"joulesched report: {said}") and len(err.splitlines()) == 1, err
    assert "hunter2" not in err
