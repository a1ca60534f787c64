"""ipmi_dcmi: recorded answers of both tools, and the real tools against a simulated BMC."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources import ipmi_dcmi
from joulesched.measurement.sources.base import Roots, Source, Zone
from joulesched.measurement.sources.ipmi_dcmi import (
    DcmiPowerReading,
    parse_freeipmi_power_statistics,
    parse_ipmitool_power_reading,
)
from tests.measurement.sources.ipmi_support import (
    PASSWORD,
    USER,
    fixture_files,
    needs_freeipmi,
    needs_ipmitool,
    remote_options,
)

# Every recorded answer, by hardware: (instantaneous watts, active). A new fixture needs a row.
EXPECTED: dict[str, tuple[float, bool]] = {
    "bmc-sim-pyghmi-active": (231, True),
    "bmc-sim-pyghmi-deactivated": (0, False),
    "dell-poweredge-r740-idrac9": (252, True),
    "hpe-proliant-dl380-gen10-ilo5": (183, True),
    "lenovo-thinksystem-sr650-xcc": (311, True),
    "supermicro-x11dpi-n": (164, True),
    "supermicro-x10drl-i-no-pmbus": (0, False),
    "openbmc-phosphor-ipmid": (234, False),  # the wattages filled, the state and timestamp never (openbmc#2819)
}

IPMITOOL_FIXTURES = fixture_files("ipmitool", "dcmi-power-reading")
FREEIPMI_FIXTURES = fixture_files("freeipmi", "ipmi-dcmi")


def _check_invariants(reading: DcmiPowerReading) -> None:
    if reading.active:
        assert reading.current_watts > 0
        assert reading.minimum_watts <= reading.maximum_watts
        assert reading.minimum_watts <= reading.average_watts <= reading.maximum_watts
        assert not reading.never_measured
    else:
        assert reading.never_measured, "a deactivated meter shows the 1970 / post-init-0 timestamp and no period"


@pytest.mark.parametrize("path", IPMITOOL_FIXTURES, ids=lambda p: p.stem)
def test_ipmitool_recorded_answer_parses_to_its_hardware_reading(path: Path) -> None:
    reading = parse_ipmitool_power_reading(path.read_text())
    assert (reading.current_watts, reading.active) == EXPECTED[path.stem]
    _check_invariants(reading)


@pytest.mark.parametrize("path", FREEIPMI_FIXTURES, ids=lambda p: p.stem)
def test_freeipmi_recorded_answer_parses_to_its_hardware_reading(path: Path) -> None:
    reading = parse_freeipmi_power_statistics(path.read_text())
    assert (reading.current_watts, reading.active) == EXPECTED[path.stem]
    _check_invariants(reading)


@pytest.mark.parametrize("stem", sorted({p.stem for p in IPMITOOL_FIXTURES} & {p.stem for p in FREEIPMI_FIXTURES}))
def test_both_tools_read_the_same_answer_alike(stem: str) -> None:
    a = parse_ipmitool_power_reading((IPMITOOL_FIXTURES[0].parent / f"{stem}.txt").read_text())
    b = parse_freeipmi_power_statistics((FREEIPMI_FIXTURES[0].parent / f"{stem}.txt").read_text())
    assert (a.current_watts, a.minimum_watts, a.maximum_watts, a.average_watts, a.active) == (
        b.current_watts,
        b.minimum_watts,
        b.maximum_watts,
        b.average_watts,
        b.active,
    )
    assert a.period_seconds == pytest.approx(b.period_seconds)


def test_ipmitool_1_8_19_timestamp_without_newline_is_not_taken_for_the_period() -> None:
    text = (IPMITOOL_FIXTURES[0].parent / "hpe-proliant-dl380-gen10-ilo5.txt").read_text()
    reading = parse_ipmitool_power_reading(text)
    assert reading.bmc_timestamp == "03/13/24 09:41:27 UTC"
    assert reading.period_seconds == 2_592_000  # 30 days: why the average is never used


@pytest.mark.parametrize("parse", [parse_ipmitool_power_reading, parse_freeipmi_power_statistics])
def test_unexpected_output_names_the_missing_lines(parse: object) -> None:
    with pytest.raises(ValueError, match="no current"):
        parse("Error: something else entirely\n")  # type: ignore[operator]


# --- options ---------------------------------------------------------------------------------------


def test_invalid_options_are_reported_all_at_once(tmp_path: Path) -> None:
    with pytest.raises(SourceFailed) as info:
        ipmi_dcmi.open_source(
            {"host": "bmc1", "password": "x", "port": 0, "tool": "racadm", "colour": "blue"}, Roots(dev=str(tmp_path))
        )
    message = str(info.value)
    for expected in (
        "password: not accepted",
        "unknown options colour",
        "port: must be",
        "tool: must be one of",
        "password_file: a remote BMC (bmc1) needs a password",
    ):
        assert expected in message


def test_in_band_without_a_device_is_absent_and_says_how_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(SourceAbsent, match=r"no local BMC device .*ipmi0.*modprobe ipmi_devintf"):
        ipmi_dcmi.open_source({"tool": "ipmitool"}, Roots(dev=str(tmp_path)))


def test_missing_tool_is_absent_and_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SourceAbsent, match="apt-get install ipmitool"):
        ipmi_dcmi.open_source({}, Roots(dev=str(tmp_path)))


def _fake_tool(tmp_path: Path, output: Path) -> tuple[Path, Path]:
    """A stand-in for ipmitool that records its argv and environment, then prints a recorded answer."""
    log = tmp_path / "argv.log"
    script = tmp_path / "ipmitool"
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > {log}\n'
        f'printf "IPMI_PASSWORD=%s\\n" "$IPMI_PASSWORD" >> {log}\n'
        f"cat {output}\n"
    )
    script.chmod(0o755)
    return script, log


def test_in_band_runs_the_open_interface(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "ipmi0").touch()
    tool, log = _fake_tool(tmp_path, IPMITOOL_FIXTURES[0].parent / "dell-poweredge-r740-idrac9.txt")
    source = ipmi_dcmi.open_source({"binary": str(tool)}, Roots(dev=str(tmp_path / "dev")))
    assert isinstance(source, Source)
    assert log.read_text().splitlines()[:5] == ["-I", "open", "dcmi", "power", "reading"]
    assert source.zones()[0].read().value == 252


@pytest.mark.parametrize(
    ("how", "expect_flag"),
    [("password_file", "-f"), ("password_env", "-E")],
    ids=["password from a file: ipmitool -f", "password from the environment: ipmitool -E"],
)
def test_the_password_is_never_on_the_command_line(
    tmp_path: Path, password_file: Path, monkeypatch: pytest.MonkeyPatch, how: str, expect_flag: str
) -> None:
    tool, log = _fake_tool(tmp_path, IPMITOOL_FIXTURES[0].parent / "dell-poweredge-r740-idrac9.txt")
    monkeypatch.setenv("BMC_PASSWORD", PASSWORD)
    secret = {"password_file": str(password_file)} if how == "password_file" else {"password_env": "BMC_PASSWORD"}
    ipmi_dcmi.open_source({"binary": str(tool), "host": "10.0.0.5", "username": USER, **secret}, Roots())
    lines = log.read_text().splitlines()
    argv, env_line = lines[:-1], lines[-1]
    assert expect_flag in argv
    assert PASSWORD not in " ".join(argv)
    assert env_line == (f"IPMI_PASSWORD={PASSWORD}" if how == "password_env" else "IPMI_PASSWORD=")


def test_an_unset_password_variable_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool, _ = _fake_tool(tmp_path, IPMITOOL_FIXTURES[0].parent / "dell-poweredge-r740-idrac9.txt")
    monkeypatch.delenv("NO_SUCH_BMC_PASSWORD", raising=False)
    with pytest.raises(SourceFailed, match=r"environment variable NO_SUCH_BMC_PASSWORD .* is not set"):
        ipmi_dcmi.open_source(
            {"binary": str(tool), "host": "10.0.0.5", "password_env": "NO_SUCH_BMC_PASSWORD"}, Roots()
        )


def test_a_recorded_deactivated_meter_is_absent_with_the_fallback_named(tmp_path: Path) -> None:
    (tmp_path / "ipmi0").touch()
    tool, _ = _fake_tool(tmp_path, IPMITOOL_FIXTURES[0].parent / "supermicro-x10drl-i-no-pmbus.txt")
    with pytest.raises(SourceAbsent, match=r"deactivated .*Thu Jan  1 00:00:00 1970.*ipmi_sdr"):
        ipmi_dcmi.open_source({"binary": str(tool)}, Roots(dev=str(tmp_path)))


def test_openbmcs_meter_is_read_though_its_state_says_deactivated(tmp_path: Path) -> None:
    """OpenBMC's phosphor-host-ipmid fills the wattages and leaves the state and timestamp unset
    (openbmc/openbmc#2819): 234 W is a reading, not a BMC without a meter."""
    (tmp_path / "ipmi0").touch()
    tool, _ = _fake_tool(tmp_path, IPMITOOL_FIXTURES[0].parent / "openbmc-phosphor-ipmid.txt")
    source = ipmi_dcmi.open_source({"binary": str(tool)}, Roots(dev=str(tmp_path)))
    try:
        (zone,) = source.zones()
        assert zone.read().value == 234.0
        assert any("'deactivated' (OpenBMC leaves the state unset): the reading is used" in n for n in source.notes)
    finally:
        source.close()


# --- the real tools against the simulated BMC ----------------------------------------------------


@needs_ipmitool
def test_real_ipmitool_reads_the_instantaneous_power_of_a_simulated_bmc(start_bmc, password_file: Path) -> None:
    bmc = start_bmc()
    before = time.time()
    source = ipmi_dcmi.open_source(remote_options(bmc, password_file, tool="ipmitool"), Roots())
    try:
        (zone,) = source.zones()
        assert isinstance(zone, Zone)
        assert (zone.name, zone.kind, zone.domain, zone.max_joules, zone.parent) == (
            "platform",
            "power",
            "platform",
            None,
            None,
        )
        first = zone.read()
        assert first.value == 231  # the instantaneous reading, not the 7-day average of 250
        assert before <= first.timestamp <= time.time()
        assert any("7.0 days" in note for note in source.notes)
        bmc.update(dcmi={**bmc.state["dcmi"], "current": 305})
        assert zone.read().value == 305
    finally:
        source.close()


@needs_ipmitool
def test_real_ipmitool_with_the_password_in_the_environment(
    start_bmc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bmc = start_bmc()
    monkeypatch.setenv("JOULESCHED_BMC_PASSWORD", PASSWORD)
    options = remote_options(bmc, tmp_path, tool="ipmitool")
    del options["password_file"]
    options["password_env"] = "JOULESCHED_BMC_PASSWORD"
    source = ipmi_dcmi.open_source(options, Roots())
    assert source.zones()[0].read().value == 231


@needs_ipmitool
@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("deactivated", r"DCMI power reading is deactivated .*use the ipmi_sdr source"),
        ("unsupported", r"is not supported by this BMC .*Invalid command"),
    ],
    ids=["meter deactivated (timestamp 0): absent", "command rejected with 0xC1: absent"],
)
def test_real_ipmitool_on_a_bmc_without_dcmi_power(start_bmc, password_file: Path, mode: str, message: str) -> None:
    bmc = start_bmc(dcmi={"mode": mode})
    with pytest.raises(SourceAbsent, match=message):
        ipmi_dcmi.open_source(remote_options(bmc, password_file, tool="ipmitool"), Roots())


@needs_ipmitool
def test_a_meter_that_stops_after_start_is_a_failed_read(start_bmc, password_file: Path) -> None:
    bmc = start_bmc()
    source = ipmi_dcmi.open_source(remote_options(bmc, password_file, tool="ipmitool"), Roots())
    bmc.update(dcmi={"mode": "deactivated"})
    with pytest.raises(SourceFailed, match="deactivated"):
        source.zones()[0].read()


@pytest.mark.parametrize(
    "tool", [pytest.param("ipmitool", marks=needs_ipmitool), pytest.param("freeipmi", marks=needs_freeipmi)]
)
def test_wrong_password_names_the_bmc_the_user_and_the_password_file(start_bmc, tmp_path: Path, tool: str) -> None:
    bmc = start_bmc()
    wrong = tmp_path / "wrong"
    wrong.write_text("not the password\n")
    options = remote_options(bmc, wrong, tool=tool, retries=0, timeout_s=8.0)
    with pytest.raises(SourceFailed) as info:
        ipmi_dcmi.open_source(options, Roots())
    message = str(info.value)
    assert f"127.0.0.1:{bmc.port}" in message and USER in message and str(wrong) in message
    assert "cannot open an IPMI session" in message


@needs_ipmitool
def test_a_bmc_that_stops_answering_fails_the_read_within_the_timeout(start_bmc, password_file: Path) -> None:
    bmc = start_bmc()
    source = ipmi_dcmi.open_source(
        remote_options(bmc, password_file, tool="ipmitool", retries=1, timeout_s=10.0), Roots()
    )
    bmc.stop()
    started = time.monotonic()
    with pytest.raises(SourceFailed, match=rf"127.0.0.1:{bmc.port}.*cannot open an IPMI session"):
        source.zones()[0].read()
    assert time.monotonic() - started < 5, "ipmitool gives up on its own (-N 1 -R 1), well before timeout_s"


@needs_freeipmi
def test_real_freeipmi_reads_the_same_bmc_through_a_private_config_file(start_bmc, password_file: Path) -> None:
    bmc = start_bmc()
    source = ipmi_dcmi.open_source(remote_options(bmc, password_file, tool="freeipmi"), Roots())
    conf = Path(source.runner.private_path("freeipmi.conf"))
    try:
        assert source.zones()[0].read().value == 231
        assert stat.S_IMODE(conf.stat().st_mode) == 0o600
        assert stat.S_IMODE(conf.parent.stat().st_mode) == 0o700
        argv, _ = source.runner.base_command()
        assert PASSWORD not in " ".join(argv)
        assert f"--config-file={conf}" in argv
    finally:
        source.close()
    assert not conf.parent.exists(), "close() removes the credentials"


@needs_freeipmi
def test_real_freeipmi_on_a_deactivated_meter(start_bmc, password_file: Path) -> None:
    bmc = start_bmc(dcmi={"mode": "deactivated"})
    with pytest.raises(SourceAbsent, match="state Not Available"):
        ipmi_dcmi.open_source(remote_options(bmc, password_file, tool="freeipmi"), Roots())


def test_freeipmi_refuses_a_password_its_config_file_cannot_hold(tmp_path: Path) -> None:
    binary = tmp_path / "ipmi-dcmi"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    secret = tmp_path / "pw"
    secret.write_text("has#hash\n")
    with pytest.raises(SourceFailed, match="use tool: ipmitool"):
        ipmi_dcmi.open_source(
            {"tool": "freeipmi", "binary": str(binary), "host": "10.0.0.5", "password_file": str(secret)}, Roots()
        )
    assert os.environ.get("IPMI_PASSWORD") is None
