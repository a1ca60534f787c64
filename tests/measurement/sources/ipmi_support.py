"""Helpers of the source tests: fixture paths, the simulated BMC handle, option builders."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
BMC_SIM = HERE / "bmc_sim.py"

USER = "monitor"
PASSWORD = "s3cret pass"  # a space on purpose: it must survive both tools' password plumbing


def fixture_files(*parts: str, suffix: str = ".txt") -> list[Path]:
    return sorted((FIXTURES.joinpath(*parts)).glob(f"*{suffix}"))


DELL_LIKE_SENSORS: list[dict[str, Any]] = [
    {"name": "Inlet Temp", "number": 4, "type": "temperature", "unit": "degrees C", "raw": 23},
    {
        "name": "Current 1",
        "number": 106,
        "type": "current",
        "unit": "Amps",
        "m": 2,
        "r_exp": -2,
        "raw": 30,
        "entity": 10,
        "instance": 1,
    },
    {"name": "Voltage 1", "number": 108, "type": "voltage", "unit": "Volts", "raw": 230, "entity": 10, "instance": 1},
    {"name": "Pwr Consumption", "number": 119, "type": "current", "unit": "Watts", "m": 2, "raw": 115},
    {"name": "Fan1", "number": 48, "type": "fan", "unit": "RPM", "m": 40, "raw": 147},
]


class SimBmc:
    """A running ``bmc_sim.py``: its UDP port on 127.0.0.1 and its state, which tests may change."""

    def __init__(self, state_file: Path, proc: subprocess.Popen[str], port: int) -> None:
        self.state_file = state_file
        self.proc = proc
        self.port = port

    @property
    def state(self) -> dict[str, Any]:
        return json.loads(self.state_file.read_text())

    def update(self, **changes: Any) -> None:
        state = self.state
        state.update(changes)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state_file)

    def set_sensor(self, name: str, raw: int | None) -> None:
        sensors = self.state["sensors"]
        for sensor in sensors:
            if sensor["name"] == name:
                sensor["raw"] = raw
        self.update(sensors=sensors)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def remote_options(bmc: SimBmc, password_file: Path, **extra: object) -> dict[str, object]:
    options: dict[str, object] = {
        "host": "127.0.0.1",
        "port": bmc.port,
        "username": USER,
        "password_file": str(password_file),
        "timeout_s": 10.0,
    }
    options.update(extra)
    return options


needs_ipmitool = pytest.mark.skipif(
    shutil.which("ipmitool") is None, reason="ipmitool not installed (apt-get install ipmitool)"
)
needs_freeipmi = pytest.mark.skipif(
    shutil.which("ipmi-dcmi") is None or shutil.which("ipmi-sensors") is None,
    reason="FreeIPMI not installed (apt-get install freeipmi-tools)",
)
