"""Whole-server power from the BMC's DCMI Get Power Reading, through the system's IPMI tools.

Two tools, one reading (DCMI 1.5 §6.6.1, NetFn 0x2C cmd 0x02):

* ``ipmitool dcmi power reading`` (Debian package ``ipmitool``);
* ``ipmi-dcmi --get-system-power-statistics`` (Debian package ``freeipmi-tools``).

The *instantaneous* ("current") reading is the one used: the DCMI "average" spans the BMC's
whole statistics period, which is often weeks (``Sampling period`` / ``Statistics reporting time
period`` in the output). A BMC that does not meter power through DCMI answers "Power reading
state is: deactivated" with an IPMI timestamp of 1970 (or zero seconds after init), or rejects
the command (completion code 0xC1): :func:`open_source` raises
:class:`~measurement.errors.SourceAbsent` saying so, and the ``ipmi_sdr`` source (power
sensors of the sensor data repository) is the fallback.

Zone: one, ``platform`` (kind ``power``, domain ``platform``); readings in watts, stamped with the
midpoint of the tool's run on the agent's clock (the BMC's own clock has one-second resolution
and is often wrong).

Options, passwords (never on a command line), running the tools and classifying their errors,
and the zone are shared with :mod:`measurement.sources.ipmi_sdr` in
:mod:`measurement.sources.ipmi_tools`; this module keeps the DCMI command and its parsers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources.base import Roots
from joulesched.measurement.sources.ipmi_tools import (
    TARGET_OPTIONS,  # re-exported: the options every IPMI source accepts
    Clock,
    IpmiRunner,
    IpmiSource,
    IpmiZone,
    open_runner,
)

NAME = "ipmi_dcmi"


# --- parsing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DcmiPowerReading:
    """One DCMI Get Power Reading answer, in SI units."""

    current_watts: float  # instantaneous: the value this source exports
    minimum_watts: float
    maximum_watts: float
    average_watts: float  # over the whole statistics period (often weeks): not used for energy
    period_seconds: float  # the BMC's statistics reporting period
    active: bool  # "Power reading state is: activated" / "Power Measurement : Active"
    bmc_timestamp: str  # as the tool printed it

    @property
    def never_measured(self) -> bool:
        """The signature of a BMC without a DCMI power meter: timestamp 1970 / 0 s after init."""
        stamp = self.bmc_timestamp
        return bool(re.search(r"1970|01/01/70|S\+\s*00:00:00|Post-Init 0 s", stamp)) and self.period_seconds == 0


_IPMITOOL_FIELDS = {
    "current": r"Instantaneous power reading\s*:?\s*(\d+)\s*Watts",
    "minimum": r"Minimum during sampling period\s*:?\s*(\d+)\s*Watts",
    "maximum": r"Maximum during sampling period\s*:?\s*(\d+)\s*Watts",
    "average": r"Average power reading over sample period\s*:?\s*(\d+)\s*Watts",
    "period": r"Sampling period\s*:?\s*(\d+)\s*Seconds",
    "state": r"Power reading state is\s*:?\s*(activated|deactivated)",
}

_FREEIPMI_FIELDS = {
    "current": r"Current Power\s*:\s*(\d+)\s*Watts",
    "minimum": r"Minimum Power over sampling duration\s*:\s*(\d+)\s*watts",
    "maximum": r"Maximum Power over sampling duration\s*:\s*(\d+)\s*watts",
    "average": r"Average Power over sampling duration\s*:\s*(\d+)\s*watts",
    "period": r"Statistics reporting time period\s*:\s*(\d+)\s*milliseconds",
    "state": r"Power Measurement\s*:\s*(Active|Not Available|Inactive|[A-Za-z ]+?)\s*$",
}


def _fields(text: str, patterns: Mapping[str, str], tool: str) -> dict[str, str]:
    found: dict[str, str] = {}
    missing: list[str] = []
    for key, pattern in patterns.items():
        match = re.search(pattern, text, re.IGNORECASE | re.MULTILINE)
        if match is None:
            missing.append(key)
        else:
            found[key] = match.group(1)
    if missing:
        excerpt = " | ".join(line.strip() for line in text.strip().splitlines()[:3]) or "(empty output)"
        raise ValueError(f"unexpected {tool} output, no {', '.join(missing)} line: {excerpt[:200]}")
    return found


def parse_ipmitool_power_reading(text: str) -> DcmiPowerReading:
    """Parse ``ipmitool dcmi power reading`` (1.8.18's layout and 1.8.19's, whose timestamp line
    lacks its newline so that "Sampling period" follows on the same line)."""
    f = _fields(text, _IPMITOOL_FIELDS, "ipmitool")
    stamp = re.search(r"IPMI timestamp\s*:?\s*(.*?)\s*(?:Sampling period|$)", text, re.MULTILINE)
    return DcmiPowerReading(
        current_watts=float(f["current"]),
        minimum_watts=float(f["minimum"]),
        maximum_watts=float(f["maximum"]),
        average_watts=float(f["average"]),
        period_seconds=float(f["period"]),
        active=f["state"].lower() == "activated",
        bmc_timestamp=stamp.group(1).strip() if stamp else "",
    )


def parse_freeipmi_power_statistics(text: str) -> DcmiPowerReading:
    """Parse FreeIPMI ``ipmi-dcmi --get-system-power-statistics``."""
    f = _fields(text, _FREEIPMI_FIELDS, "ipmi-dcmi")
    stamp = re.search(r"Time Stamp\s*:\s*(.*?)\s*$", text, re.MULTILINE)
    return DcmiPowerReading(
        current_watts=float(f["current"]),
        minimum_watts=float(f["minimum"]),
        maximum_watts=float(f["maximum"]),
        average_watts=float(f["average"]),
        period_seconds=float(f["period"]) / 1000.0,
        active=f["state"].strip().lower() == "active",
        bmc_timestamp=stamp.group(1).strip() if stamp else "",
    )


# --- the source ------------------------------------------------------------------------------------


class IpmiDcmi(IpmiSource):
    """Whole-server power from DCMI Get Power Reading."""

    name = NAME

    def __init__(self, runner: IpmiRunner) -> None:
        super().__init__(runner, IpmiZone("platform", self._read_power))
        self.last: DcmiPowerReading | None = None

    @property
    def command(self) -> list[str]:
        if self.target.tool == "ipmitool":
            return ["dcmi", "power", "reading"]
        return ["--get-system-power-statistics"]

    def describe(self) -> dict[str, str]:
        return {"tool": self.target.tool, "binary": self.target.binary, "bmc": self.target.describe()}

    def query(self) -> tuple[DcmiPowerReading, float]:
        """Run the tool once; raise SourceAbsent/SourceFailed (absent: the BMC has no DCMI power)."""
        result = self.runner.run(self.command)
        parse = parse_ipmitool_power_reading if self.target.tool == "ipmitool" else parse_freeipmi_power_statistics
        try:
            reading = parse(result.stdout)
        except ValueError as err:
            raise SourceFailed(
                f"{NAME} ({self.target.describe()}): {err} — report the tool version and BMC model"
            ) from err
        if not reading.active and reading.current_watts > 0:
            # OpenBMC's phosphor-host-ipmid fills the wattages and never the state or timestamp
            # (openbmc/openbmc#2819): a reading of watts is a meter, whatever the state says
            if self.last is None and not any("deactivated" in n for n in self.notes):
                self.notes.append(
                    f"{NAME}: the BMC reports {reading.current_watts:g} W with its power reading state "
                    "'deactivated' (OpenBMC leaves the state unset): the reading is used"
                )
            self.last = reading
            return reading, result.midpoint
        if not reading.active and self.last is not None:  # it metered a moment ago: it stopped, it is not absent
            raise SourceFailed(
                f"{NAME} ({self.target.describe()}): DCMI power reading is deactivated now, after it read "
                f"{self.last.current_watts:g} W — the BMC stopped metering (a BMC reset, firmware update or power "
                "meter fault); it is read again when it reactivates"
            )
        if not reading.active:
            raise SourceAbsent(
                f"{NAME} ({self.target.describe()}): DCMI power reading is deactivated (state "
                f"{'deactivated' if self.target.tool == 'ipmitool' else 'Not Available'}, IPMI timestamp "
                f"{reading.bmc_timestamp or '?'}) — this BMC does not meter system power through DCMI; use the "
                "ipmi_sdr source (power sensors) or redfish instead"
            )
        if reading.current_watts <= 0:
            raise SourceAbsent(
                f"{NAME} ({self.target.describe()}): DCMI reports {reading.current_watts:g} W while the server runs "
                "— no power meter behind DCMI (common without PMBus power supplies); use the ipmi_sdr or redfish source"
            )
        self.last = reading
        return reading, result.midpoint

    def _read_power(self) -> tuple[float, float]:
        reading, timestamp = self.query()  # SourceAbsent now: the zone reports it as a failure
        return reading.current_watts, timestamp


def open_source(options: dict[str, object], roots: Roots, clock: Clock | None = None) -> IpmiDcmi:
    """Open the DCMI power source and take one reading.

    Options (all optional): ``tool`` (auto|ipmitool|freeipmi, default auto: ipmitool, else
    FreeIPMI), ``binary`` (path), ``host`` (remote BMC; default in-band), ``port`` (623),
    ``username`` (""), ``password_file`` or ``password_env`` (one of them for a remote BMC),
    ``interface`` (lanplus|lan), ``cipher_suite`` (int, tool default), ``privilege``
    (user|operator|administrator, default user), ``timeout_s`` (15), ``retries`` (2), ``clock``
    (callable, default time.time).
    """
    runner = open_runner(
        NAME, options, roots, clock, default_binaries={"ipmitool": "ipmitool", "freeipmi": "ipmi-dcmi"}
    )
    runner.check_in_band_device()
    source = IpmiDcmi(runner)
    try:
        reading, _ = source.query()
    except BaseException:
        runner.close()
        raise
    if reading.period_seconds > 3600:
        source.notes.append(
            f"{NAME}: the BMC's DCMI average spans {reading.period_seconds / 86400:.1f} days; the instantaneous "
            "reading is used"
        )
    return source


__all__ = [
    "NAME",
    "TARGET_OPTIONS",
    "DcmiPowerReading",
    "IpmiDcmi",
    "open_source",
    "parse_freeipmi_power_statistics",
    "parse_ipmitool_power_reading",
]
