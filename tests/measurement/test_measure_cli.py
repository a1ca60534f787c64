"""``joulesched measure -- CMD`` and ``joulesched agent`` as real processes on a replica tree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from joulesched.cli import main as joulesched_main
from joulesched.contracts.net import free_port
from joulesched.measurement.cli import measure_main
from tests.measurement.replica import PowercapTree, ProcTree

PROGRAM = """
import pathlib, sys
zone = pathlib.Path(sys.argv[1])
for name, joules in (("intel-rapl:0", 150.025), ("intel-rapl:0:1", 25.05)):
    f = zone / name / "energy_uj"
    top = int((zone / name / "max_energy_range_uj").read_text())
    f.write_text(str((int(f.read_text()) + round(joules * 1e6)) % top) + "\\n")  # wraps like the hardware
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    powercap = PowercapTree(tmp_path / "sys")
    powercap.add("intel-rapl:0", "package-0", energy_uj=262_143_328_850 - 50_000_000)  # wraps during the run
    powercap.add("intel-rapl:0:1", "dram", energy_uj=1_000_000)
    ProcTree(tmp_path / "proc")
    return tmp_path


def flags(tree: Path) -> list[str]:
    return [
        "--sysfs-root",
        str(tree / "sys"),
        "--procfs-root",
        str(tree / "proc"),
        "--cgroup-root",
        str(tree / "cg"),
        "--dev-root",
        str(tree / "dev"),
    ]


@pytest.mark.parametrize("exit_code", [0, 3], ids=["the command succeeds", "the command fails"])
def test_measure_prints_energy_per_domain_and_keeps_the_exit_code(
    tree: Path, capfd: pytest.CaptureFixture[str], exit_code: int
) -> None:
    out = tree / "result.json"
    argv = [
        *flags(tree),
        "--interval",
        "0.1",
        "--output",
        str(out),
        "--",
        sys.executable,
        "-c",
        PROGRAM,
        str(tree / "sys/class/powercap"),
        str(exit_code),
    ]
    assert measure_main(argv) == exit_code
    err = capfd.readouterr().err
    assert f"exited {exit_code} after" in err
    assert "  node       0.175075 kJ   (basis: rapl_sysfs)" in err
    assert "  cpu        0.150025 kJ" in err
    assert "  dram       0.025050 kJ" in err
    assert "  sources: rapl_sysfs (dram-0, package-0); absent: " in err
    result = json.loads(out.read_text())
    assert result["exit_code"] == exit_code
    assert result["joules"]["node"] == pytest.approx(175.075, abs=1e-6)
    assert result["outcomes"]["rapl_sysfs"]["status"] == "open"


def test_measure_through_the_console_entry_point(tree: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code = joulesched_main(["measure", *flags(tree), "--json", "--", sys.executable, "-c", "pass"])
    assert code == 0
    result = json.loads(capfd.readouterr().err)
    assert result["joules"]["node"] == 0.0 and result["basis"] == "rapl_sysfs"


def test_measure_a_command_that_does_not_exist(tree: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert measure_main([*flags(tree), "--", str(tree / "no-such-program")]) == 127
    assert "cannot run" in capfd.readouterr().err


def test_measure_a_command_killed_by_a_signal(tree: Path) -> None:
    assert (
        measure_main(
            [*flags(tree), "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
        )
        == 128 + 9
    )


def test_measure_without_any_source_still_runs_the_command(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert measure_main([*flags(tmp_path), "--", sys.executable, "-c", "raise SystemExit(5)"]) == 5
    err = capfd.readouterr().err
    assert "ESTIMATED energy:" in err and "absent: rapl_sysfs" in err


def test_measure_needs_a_command(tree: Path) -> None:
    with pytest.raises(SystemExit) as err:
        measure_main(flags(tree))
    assert err.value.code == 2


def test_agent_refuses_a_bad_config_with_every_problem(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("attribution: {idle_policy: even}\nserver: {listen: nowhere}\n")
    from joulesched.measurement.cli import agent_main

    assert agent_main(["--config", str(config)]) == 2
    err = capfd.readouterr().err
    assert "attribution.idle_policy" in err and "server.listen" in err


def test_agent_process_serves_and_stops_on_sigterm(tree: Path) -> None:
    port = free_port()
    record = tree / "samples.jsonl.gz"
    cmd = [
        sys.executable,
        "-m",
        "joulesched",
        "agent",
        *flags(tree),
        "--listen",
        f"127.0.0.1:{port}",
        "--interval",
        "0.2",
        "--record",
        str(record),
        "--node-name",
        "node-a",
    ]
    agent = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONWARNINGS": "error"}
    )
    try:
        deadline = time.monotonic() + 20
        body = b""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    body = response.read()
                if b"joulesched_node_energy_joules_total" in body:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert b'zone="package-0"' in body
        time.sleep(0.5)
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=20)
    assert agent.returncode == 0, err.decode()
    assert b"energy sources: rapl_sysfs: open (2 zones)" in err
    from joulesched.measurement.exporters.record import load_recording

    recording = load_recording(str(record))
    assert recording.header["node"] == "node-a"
    assert len(recording.samples) >= 2
