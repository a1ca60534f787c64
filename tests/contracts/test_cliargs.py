"""``contracts.cliargs.number``: every command's bounded numbers, refused in one form by flag."""

from __future__ import annotations

import argparse

import pytest

from joulesched.cli import main as joulesched
from joulesched.contracts.cliargs import INTENSITY, number


@pytest.mark.parametrize(
    ("kind", "text", "said"),
    [
        (number(above=0, unit="seconds"), "0", "must be a finite number > 0 seconds, got '0'"),
        (number(above=0, unit="seconds"), "nan", "must be a finite number > 0 seconds, got 'nan'"),
        (number(above=0, unit="seconds"), "-inf", "must be a finite number > 0 seconds, got '-inf'"),
        (number(above=0, unit="seconds"), "ten", "must be a finite number > 0 seconds, got 'ten'"),
        (number(at_least=0, below=1), "1", "must be a finite number >= 0 and < 1, got '1'"),
        (number(whole=True, at_least=1), "1.5", "must be a whole number >= 1, got '1.5'"),
        (number(whole=True, at_least=0, at_most=100), "101", "must be a whole number >= 0 and <= 100, got '101'"),
        (number(), "inf", "must be a finite number, got 'inf'"),
        (INTENSITY, "400000", "must be a finite number >= 0 and <= 5000 gCO2e/kWh, got '400000'"),
    ],
)
def test_a_number_out_of_its_bounds_says_what_it_must_be(kind, text: str, said: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        kind(text)
    assert str(refused.value) == said


def test_a_number_within_its_bounds_is_taken_as_its_type() -> None:
    assert number(above=0)("0.5") == 0.5 and isinstance(number(whole=True)("7"), int)
    assert number(at_least=0, at_most=1)("1") == 1.0 and number(at_least=0, below=1)("0") == 0.0


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        # NaN passed the expander's `--watch <= 0` check and its --timeout had none
        (["expander", "--profiles", "p.yaml", "--watch", "nan"], "argument --watch: must be a finite number > 0 seconds, got 'nan'"),
        (["expander", "--profiles", "p.yaml", "--timeout", "-1"], "argument --timeout: must be a finite number > 0 seconds, got '-1'"),
        (["deferrer", "--site-file", "s.yaml", "--tolerance", "1"], "argument --tolerance: must be a finite number >= 0 and < 1, got '1'"),
        (["deferrer", "--site-file", "s.yaml", "--interval", "0"], "argument --interval: must be a finite number > 0 seconds, got '0'"),
        (["deferrer", "--site-file", "s.yaml", "--clock-offset", "nan"], "argument --clock-offset: must be a finite number, got 'nan'"),
        (["measure", "--intensity", "-1", "--", "true"], "argument --intensity: must be a finite number >= 0 and <= 5000 gCO2e/kWh, got '-1'"),
        (["measure", "--vm-share", "1.5", "--", "true"], "argument --vm-share: must be a finite number > 0 and <= 1, got '1.5'"),
        (["measure", "--provider-wait", "nan", "--", "true"], "argument --provider-wait: must be a finite number >= 0 seconds, got 'nan'"),
        (["agent", "--interval", "0.01"], "argument --interval: must be a finite number >= 0.1 and <= 60 seconds, got '0.01'"),
    ],
)
def test_each_command_refuses_a_number_out_of_bounds_by_its_flag(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        joulesched(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].split(": error: ", 1)[1] == said
