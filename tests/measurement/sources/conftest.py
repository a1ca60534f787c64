"""Fixtures of the source tests: a simulated BMC on loopback (see bmc_sim.py) and its password file."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.measurement.sources.ipmi_support import BMC_SIM, DELL_LIKE_SENSORS, PASSWORD, USER, SimBmc


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "bmc-password"
    path.write_text(PASSWORD + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def start_bmc(tmp_path: Path) -> Iterator[Any]:
    """Factory: start a simulated BMC with the given DCMI state and sensors; stopped after the test."""
    started: list[SimBmc] = []

    def start(dcmi: dict[str, Any] | None = None, sensors: list[dict[str, Any]] | None = None) -> SimBmc:
        state = {
            "users": {USER: PASSWORD},
            "dcmi": dcmi
            if dcmi is not None
            else {
                "mode": "active",
                "current": 231,
                "minimum": 180,
                "maximum": 402,
                "average": 250,
                "period_ms": 604_800_000,
            },
            "sensors": sensors if sensors is not None else DELL_LIKE_SENSORS,
        }
        state_file = tmp_path / f"bmc-state-{len(started)}.json"
        state_file.write_text(json.dumps(state))
        log = tmp_path / f"bmc-{len(started)}.log"
        with open(log, "w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, str(BMC_SIM), str(state_file)], stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 15)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("PORT "):
            SimBmc(state_file, proc, 0).stop()
            pytest.fail(f"simulated BMC did not start: {line!r} {log.read_text()[-2000:]}")
        bmc = SimBmc(state_file, proc, int(line.split()[1]))
        started.append(bmc)
        return bmc

    yield start
    for bmc in started:
        bmc.stop()
