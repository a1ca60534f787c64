"""Whole-server power from the BMC's power sensors (sensor data repository), the DCMI fallback.

Many BMCs that do not meter power through DCMI (``ipmi_dcmi`` finds "Power reading state is:
deactivated") still list a power sensor in their SDR, e.g.::

    Pwr Consumption  | 77h | ok  |  7.1 | 230 Watts          (Dell iDRAC, sensor type Current)
    Power Meter      | 23h | ok  |  7.1 | 230 Watts          (HPE iLO)
    PS1 Input Power  | 64h | ok  | 10.1 | 120 Watts          (per power supply)

Discovery lists every analog sensor once (``ipmitool sdr elist full``, or FreeIPMI
``ipmi-sensors``), keeps those in watts and picks, unless option ``sensors`` names them:

1. the first sensor named like a whole-platform meter (:data:`PLATFORM_NAMES`), else
2. the sum of the power supplies' *input* sensors (:data:`PSU_INPUT_NAMES`: input power is the
   server's draw from the wall; output sensors are not used, nor a PSU on top of a meter).

Otherwise the source is absent, and the message lists the watt sensors it saw so that the
``sensors`` option can be set. Reads then ask only for the chosen sensors (``ipmitool sensor
reading NAME…`` against a local SDR cache, ``ipmi-sensors --record-ids``), which is a few IPMI
requests rather than a walk of the whole repository.

Zone: one, ``platform`` (kind ``power``, domain ``platform``), in watts. Options, passwords, the
way the tools run and the zone are those of :mod:`measurement.sources.ipmi_tools` (shared with
:mod:`measurement.sources.ipmi_dcmi`); this module keeps the sensor listing, choice and reads.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources.base import Roots
from joulesched.measurement.sources.ipmi_tools import IpmiRunner, IpmiSource, IpmiZone, open_runner

NAME = "ipmi_sdr"

PLATFORM_NAMES = re.compile(
    r"^(pwr consumption|power meter|system level|sys(tem)?[ _]?power|total[ _]?power|power[ _]consumption"
    r"|server[ _]power|node[ _]power|platform[ _]power|chassis[ _]power)$",
    re.IGNORECASE,
)
# A power supply's input: "PS1 Input Power", "PSU2_PIN", "PS1 Power In" (not "PS1 Curr Out %").
PSU_INPUT_NAMES = re.compile(r"^(ps|psu|pws|power[ _]?supply)[ _-]?\d+", re.IGNORECASE)
PSU_INPUT_TOKEN = re.compile(r"(?<![a-z])(pin|input|in)(?![a-z])", re.IGNORECASE)


@dataclass(frozen=True)
class SensorReading:
    """One row of a sensor listing."""

    name: str
    record: str  # ipmitool: sensor number ("77h"); FreeIPMI: record id ("4")
    status: str  # ok, ns, nc, cr, nr, N/A ...
    value: float | None  # None: no reading
    unit: str  # as printed: Watts, Amps, degrees C ... (FreeIPMI: W, A, C)

    @property
    def watts(self) -> bool:
        return self.unit in ("Watts", "W")


def parse_ipmitool_sdr_elist(text: str) -> list[SensorReading]:
    """Parse ``ipmitool sdr elist`` / ``sdr elist full`` / ``sdr type …`` (name | id | status | entity | reading)."""
    rows: list[SensorReading] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != 5 or not parts[0]:
            continue
        name, number, status, _entity, reading = parts
        match = re.match(r"^(-?\d+(?:\.\d+)?)\s+(.+?)\s*$", reading)
        if match and status.lower() != "ns":
            unit = match.group(2).split(",")[0].strip()
            rows.append(SensorReading(name, number, status, float(match.group(1)), unit))
        else:
            rows.append(SensorReading(name, number, status, None, ""))
    return rows


def parse_ipmitool_sensor_reading(text: str) -> dict[str, float]:
    """Parse ``ipmitool sensor reading NAME…`` (``name | value``; sensors without a reading are left out)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 2 and parts[0]:
            try:
                values[parts[0]] = float(parts[1])
            except ValueError:
                continue
    return values


def parse_freeipmi_sensors(text: str) -> list[SensorReading]:
    """Parse FreeIPMI ``ipmi-sensors --comma-separated-output --no-header-output`` (ID,Name,Type,Reading,Units,Event)."""
    rows: list[SensorReading] = []
    for fields in csv.reader(io.StringIO(text)):
        if len(fields) < 6 or not fields[0].strip().isdigit():
            continue
        record, name, _type, reading, unit = (f.strip() for f in fields[:5])
        try:
            value: float | None = float(reading)
        except ValueError:
            value = None
        rows.append(SensorReading(name, record, "ok" if value is not None else "N/A", value, unit))
    return rows


def choose_sensors(sensors: Sequence[SensorReading], wanted: Sequence[str] | None) -> tuple[list[SensorReading], str]:
    """Pick the sensors whose sum is the server's power; return them and why. ValueError if none fit."""
    watt_sensors = [s for s in sensors if s.watts and s.value is not None]
    if wanted:
        by_name = {s.name: s for s in sensors}
        missing = [n for n in wanted if n not in by_name]
        if missing:
            raise ValueError(
                f"sensors {', '.join(repr(n) for n in missing)} (option sensors) not in the SDR; watt sensors present: "
                f"{_names(watt_sensors)}"
            )
        not_watts = [n for n in wanted if by_name[n].value is not None and not by_name[n].watts]
        if not_watts:
            raise ValueError(f"sensors {', '.join(repr(n) for n in not_watts)} (option sensors) do not read in watts")
        return [by_name[n] for n in wanted], "configured"
    platform = [s for s in watt_sensors if PLATFORM_NAMES.match(s.name)]
    if platform:
        return [platform[0]], f"platform meter {platform[0].name!r}"
    inputs = [s for s in watt_sensors if PSU_INPUT_NAMES.match(s.name) and PSU_INPUT_TOKEN.search(s.name)]
    if inputs:
        return inputs, "sum of power-supply inputs " + _names(inputs)
    raise ValueError(
        "no whole-server power sensor in the SDR (no platform meter such as 'Pwr Consumption' or 'Power Meter', no "
        f"power-supply input sensors); watt sensors present: {_names(watt_sensors)} — if one of them is the "
        "server's draw, name it in option sensors"
    )


def _names(sensors: Sequence[SensorReading]) -> str:
    return ", ".join(repr(s.name) for s in sensors) if sensors else "none"


class IpmiSdr(IpmiSource):
    """Whole-server power from SDR power sensors (the zone's ``sensors``, summed)."""

    name = NAME

    def __init__(self, runner: IpmiRunner, chosen: Sequence[SensorReading], why: str, sdr_cache: str | None) -> None:
        self.chosen = list(chosen)
        super().__init__(runner, IpmiZone("platform", self._read_power, tuple(s.name for s in self.chosen)))
        self.why = why
        self.sdr_cache = sdr_cache
        self.notes.append(f"{NAME} ({self.target.describe()}): using {why}")

    def describe(self) -> dict[str, str]:
        return {"tool": self.target.tool, "bmc": self.target.describe(), "sensors": ", ".join(self._zone.sensors)}

    def _cache_args(self) -> list[str]:
        if self.target.tool == "ipmitool":
            cache = self.sdr_cache
            return ["-S", cache] if cache else []
        return [f"--sdr-cache-directory={self.runner.sdr_cache_dir()}", "--quiet-cache"]

    def _read_power(self) -> tuple[float, float]:
        # a SourceAbsent from the run (the BMC stopped answering the command): the zone reports it as a failure
        if self.target.tool == "ipmitool":
            result = self.runner.run([*self._cache_args(), "sensor", "reading", *self._zone.sensors])
            values = parse_ipmitool_sensor_reading(result.stdout)
        else:
            ids = ",".join(s.record for s in self.chosen)
            result = self.runner.run(
                [*self._cache_args(), "--comma-separated-output", "--no-header-output", f"--record-ids={ids}"]
            )
            values = {s.name: s.value for s in parse_freeipmi_sensors(result.stdout) if s.value is not None}
        missing = [n for n in self._zone.sensors if n not in values]
        if missing:
            raise SourceFailed(
                f"{NAME} ({self.target.describe()}): sensor {', '.join(repr(n) for n in missing)} gave no reading "
                "(status ns: the BMC is not scanning it, or the power supply is absent) — check the power supplies "
                "and the BMC's sensor list (ipmitool sdr elist full)"
            )
        return sum(values[n] for n in self._zone.sensors), result.midpoint


def _list_sensors(runner: IpmiRunner) -> tuple[list[SensorReading], str | None]:
    """Every analog sensor once; for ipmitool, also dump the SDR to a private cache for later reads."""
    if runner.target.tool == "ipmitool":
        path = runner.private_path("ipmitool-sdr.cache")
        try:
            runner.run(["sdr", "dump", path])
        except SourceFailed:  # read without a cache: slower, still correct
            return parse_ipmitool_sdr_elist(runner.run(["sdr", "elist", "full"]).stdout), None
        return parse_ipmitool_sdr_elist(runner.run(["-S", path, "sdr", "elist", "full"]).stdout), path
    args = [
        f"--sdr-cache-directory={runner.sdr_cache_dir()}",
        "--quiet-cache",
        "--comma-separated-output",
        "--no-header-output",
    ]
    return parse_freeipmi_sensors(runner.run(args).stdout), None


def open_source(options: dict[str, object], roots: Roots, clock: Callable[[], float] | None = None) -> IpmiSdr:
    """Open the SDR power-sensor source.

    Options: those of :func:`measurement.sources.ipmi_dcmi.open_source` (tool, binary, host,
    port, username, password_file, password_env, interface, cipher_suite, privilege, timeout_s,
    retries, clock), plus ``sensors`` (list of sensor names whose sum is the server's power;
    default: found by name, see the module docstring).
    """
    runner = open_runner(
        NAME,
        options,
        roots,
        clock,
        default_binaries={"ipmitool": "ipmitool", "freeipmi": "ipmi-sensors"},
        extra_options=frozenset({"sensors"}),
    )
    target = runner.target
    wanted = options.get("sensors")
    if wanted is not None and (
        not isinstance(wanted, list | tuple) or not wanted or not all(isinstance(n, str) and n for n in wanted)
    ):
        raise SourceFailed(
            f"{NAME}: invalid options — sensors: must be a non-empty list of sensor names, got {wanted!r}"
        )
    try:
        runner.check_in_band_device()
        sensors, cache = _list_sensors(runner)
        try:
            chosen, why = choose_sensors(sensors, list(wanted) if wanted else None)
        except ValueError as err:
            raise SourceAbsent(f"{NAME} ({target.describe()}): {err}") from err
        source = IpmiSdr(runner, chosen, why, cache)
        source.zones()[0].read()  # one read now: a sensor without a reading fails at start, not later
    except BaseException:
        runner.close()
        raise
    return source


__all__ = [
    "NAME",
    "IpmiSdr",
    "SensorReading",
    "choose_sensors",
    "open_source",
    "parse_freeipmi_sensors",
    "parse_ipmitool_sdr_elist",
    "parse_ipmitool_sensor_reading",
]
