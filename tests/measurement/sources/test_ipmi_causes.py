"""IPMI failures name the configured address and the real cause, with the real tools.

A wrong password, a user the BMC does not know and a BMC that does not answer each get their own
message from ipmitool and FreeIPMI alike, naming the configured port (never a fixed 623); a meter
that stops mid-run is not called absent; the meter warns once per change, not once per read.
"""

from __future__ import annotations

import logging
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from joulesched.measurement.errors import SourceFailed
from joulesched.measurement.meter import EnergyMeter
from joulesched.measurement.sources import ipmi_dcmi
from joulesched.measurement.sources.base import Roots
from tests.measurement.fakes import FakeClock, FakeSource, FakeZone
from tests.measurement.sources.ipmi_support import needs_freeipmi, needs_ipmitool, remote_options

TOOLS = [pytest.param("ipmitool", marks=needs_ipmitool), pytest.param("freeipmi", marks=needs_freeipmi)]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A UDP port on loopback that takes every datagram and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def _open_error(options: dict[str, object]) -> str:
    with pytest.raises(SourceFailed) as info:
        ipmi_dcmi.open_source(options, Roots())
    return str(info.value)


@pytest.mark.parametrize("tool", TOOLS)
def test_a_wrong_password_is_called_a_wrong_password(start_bmc, tmp_path: Path, tool: str) -> None:
    bmc = start_bmc()
    wrong = tmp_path / "wrong"
    wrong.write_text("not the password\n")
    message = _open_error(remote_options(bmc, wrong, tool=tool, retries=0, timeout_s=8.0))
    assert f"the BMC at 127.0.0.1:{bmc.port} rejected the password of user 'monitor'" in message, message
    assert str(wrong) in message


@pytest.mark.parametrize("tool", TOOLS)
def test_a_bmc_that_does_not_answer_is_named_with_its_configured_port(
    password_file: Path, silent_port: int, tool: str
) -> None:
    options = {
        "host": "127.0.0.1",
        "port": silent_port,
        "username": "monitor",
        "password_file": str(password_file),
        "tool": tool,
        "retries": 1,
        "timeout_s": 8.0,
    }
    message = _open_error(options)
    assert f"no answer from the BMC at 127.0.0.1:{silent_port}" in message, message
    assert f"UDP {silent_port}" in message and "UDP 623" not in message
    assert "password" not in message.split("—")[0], "not taken for an authentication failure"


@needs_freeipmi
def test_an_unknown_user_is_not_called_a_network_timeout(start_bmc, password_file: Path) -> None:
    """The simulated BMC, like some real ones, drops the session of a user it does not know:
    FreeIPMI's session times out after the BMC answered."""
    bmc = start_bmc()
    options = remote_options(bmc, password_file, tool="freeipmi", username="nobody", retries=0, timeout_s=8.0)
    message = _open_error(options)
    assert f"127.0.0.1:{bmc.port}" in message
    assert "user 'nobody'" in message and "check option username" in message, message
    assert "no answer from the BMC" not in message


# ipmitool 1.8.19 against the simulated BMC for user "nobody" (it needs 9 s to give up: recorded),
# and what it prints for a real BMC's RAKP 2 "unauthorized name" (lanplus) or "Invalid user name" (lan).
IPMITOOL_UNKNOWN_USER = [
    "> Error: no response from RAKP 1 message\n> Error: no response from RAKP 1 message\n"
    "Error sending request.\nGet Device ID command failed\nNo valid response received\n\n    Unable to get DCMI information",
    "RAKP 2 message indicates an error : unauthorized name\nError: Unable to establish IPMI v2 / RMCP+ session",
    "Invalid user name\nError: Unable to establish LAN session\nGet Device ID command failed",
]


@needs_ipmitool
@pytest.mark.parametrize("stderr", IPMITOOL_UNKNOWN_USER)
def test_ipmitool_unknown_user_answers_are_classified(password_file: Path, stderr: str) -> None:
    from joulesched.measurement.sources.ipmi_tools import IpmiRunner, ToolResult, parse_target

    options = {"host": "10.0.0.5", "port": 6230, "username": "nobody", "password_file": str(password_file)}
    target, _ = parse_target("ipmi_dcmi", {**options, "tool": "ipmitool"}, default_binaries={"ipmitool": "ipmitool"})
    error = IpmiRunner("ipmi_dcmi", target).classify("ipmitool dcmi power reading", ToolResult("", stderr, 1, 0.0, 1.0))
    message = str(error)
    assert isinstance(error, SourceFailed)
    assert "the BMC at 10.0.0.5:6230 does not know user 'nobody'" in message and "623 " not in message


def test_timeout_of_the_tool_names_the_configured_port(password_file: Path, silent_port: int, tmp_path: Path) -> None:
    """The tool itself outlives timeout_s (a stub that hangs): the message names the port."""
    stub = tmp_path / "ipmitool"
    stub.write_text("#!/bin/sh\nsleep 30\n")
    stub.chmod(0o755)
    options = {
        "host": "127.0.0.1",
        "port": silent_port,
        "username": "monitor",
        "password_file": str(password_file),
        "binary": str(stub),
        "tool": "ipmitool",
        "timeout_s": 1.0,
    }
    message = _open_error(options)
    assert "did not finish within 1 s" in message and f"UDP {silent_port}" in message and "623" not in message


@needs_ipmitool
@needs_freeipmi
def test_auto_prefers_freeipmi_when_both_tools_are_installed(start_bmc, password_file: Path) -> None:
    assert shutil.which("ipmi-dcmi") and shutil.which("ipmitool")
    source = ipmi_dcmi.open_source(remote_options(start_bmc(), password_file), Roots())
    try:
        assert source.target.tool == "freeipmi"
    finally:
        source.close()


@needs_freeipmi
def test_a_meter_that_stops_mid_run_is_a_failure_not_an_absent_meter(start_bmc, password_file: Path) -> None:
    bmc = start_bmc()
    source = ipmi_dcmi.open_source(remote_options(bmc, password_file, tool="freeipmi"), Roots())
    try:
        bmc.update(dcmi={"mode": "deactivated"})
        with pytest.raises(SourceFailed) as info:
            source.zones()[0].read()
        message = str(info.value)
        assert "deactivated now, after it read 231 W" in message and "does not meter" not in message
    finally:
        source.close()


def test_one_warning_per_change_of_state_not_per_read(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    zone = FakeZone("platform", "platform", "power", clock, 300.0)
    meter = EnergyMeter([FakeSource("ipmi_dcmi", [zone])], clock=clock, retry_max_seconds=1.0)
    meter.read()
    caplog.set_level(logging.INFO, logger="joulesched.measurement.meter")
    zone.fail = "ipmi_dcmi (BMC 10.0.0.5:6230): cannot open an IPMI session: no answer"
    for _ in range(20):
        clock.tick()
        meter.read()
    zone.fail = "ipmi_dcmi (BMC 10.0.0.5:6230): cannot open an IPMI session: the BMC rejected the password"
    for _ in range(20):
        clock.tick()
        meter.read()
    zone.fail = ""
    for _ in range(5):
        clock.tick()
        meter.read()
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "source" in r.getMessage()[:7]
    ]
    assert len(warnings) == 2, warnings
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == ["source ipmi_dcmi: reading again"]


def _ipmi_up(meter: EnergyMeter) -> bool:
    return next(s.up for s in meter.source_snapshots() if s.name == "ipmi_dcmi")


@needs_freeipmi
def test_a_bmc_killed_mid_run_stalls_no_other_source(start_bmc, password_file: Path) -> None:
    """The real FreeIPMI against a BMC that is killed: its reads take seconds each to fail, the
    other source and every meter read go on at their pace, and it is read again once it is back."""
    import time

    clock = time.time
    bmc = start_bmc()
    ipmi = ipmi_dcmi.open_source(remote_options(bmc, password_file, tool="freeipmi", timeout_s=6.0), Roots())
    rapl = FakeSource("rapl_sysfs", [FakeZone("package-0", "package", "counter", clock, max_joules=1e9)])
    meter = EnergyMeter([rapl, ipmi], clock=clock, retry_initial_seconds=0.5, retry_max_seconds=1.0)
    meter.start(0.05)
    try:
        meter.read(wait=5.0)
        bmc.stop()
        slowest, energy = 0.0, 0.0
        # read for at least 5 s, and on until FreeIPMI's first failure is reported: its session
        # timeout is 4.8 s (0.8 x timeout_s), counted from whenever its read after the kill began
        stopped = time.monotonic()
        while time.monotonic() < stopped + 5.0 or (_ipmi_up(meter) and time.monotonic() < stopped + 20.0):
            energy += 10.0
            rapl.zone_list[0].value = energy
            started = time.perf_counter()
            # a generous wait (the default is 50 ms): on a loaded machine the reader thread may
            # need longer to be scheduled, and the point is what the read waits for, not how fast
            totals = meter.read(wait=1.0).totals
            slowest = max(slowest, time.perf_counter() - started)
            assert totals[("rapl_sysfs", "package-0")] == round(energy * 1e9), "the other source read this time"
            time.sleep(0.1)
        health = {s.name: s for s in meter.source_snapshots()}
        assert slowest < 1.5, slowest  # a read waiting for FreeIPMI would take its 6 s timeout
        assert not health["ipmi_dcmi"].up and "no answer from the BMC" in health["ipmi_dcmi"].error
    finally:
        meter.stop()
        ipmi.close()
