"""ipmi_sdr: power sensors from recorded sensor listings, and the real tools against a simulated BMC."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources import ipmi_sdr
from joulesched.measurement.sources.base import Roots, Source
from joulesched.measurement.sources.ipmi_sdr import (
    SensorReading,
    choose_sensors,
    parse_freeipmi_sensors,
    parse_ipmitool_sdr_elist,
    parse_ipmitool_sensor_reading,
)
from tests.measurement.sources.ipmi_support import (
    DELL_LIKE_SENSORS,
    fixture_files,
    needs_freeipmi,
    needs_ipmitool,
    remote_options,
)

# Every recorded listing, by hardware: (chosen sensors, watts) or None when no sensor fits.
EXPECTED: dict[str, tuple[tuple[str, ...], float] | None] = {
    "bmc-sim-pyghmi": (("Pwr Consumption",), 230),
    "dell-poweredge-r740-idrac9": (("Pwr Consumption",), 252),
    "hpe-proliant-dl380-gen10-ilo5": (("Power Meter",), 183),  # the meter, not the two supplies on top
    "intel-s2600wft": (("PS1 Input Power", "PS2 Input Power"), 242),
    "supermicro-x10drl-i-no-pmbus": None,
}

IPMITOOL_FIXTURES = fixture_files("ipmitool", "sdr-elist-full")
FREEIPMI_FIXTURES = fixture_files("freeipmi", "ipmi-sensors")


def _expect(rows: list[SensorReading], stem: str) -> None:
    expected = EXPECTED[stem]
    if expected is None:
        with pytest.raises(ValueError, match="no whole-server power sensor"):
            choose_sensors(rows, None)
        return
    chosen, _ = choose_sensors(rows, None)
    assert tuple(s.name for s in chosen) == expected[0]
    assert sum(s.value or 0 for s in chosen) == expected[1]


@pytest.mark.parametrize("path", IPMITOOL_FIXTURES, ids=lambda p: p.stem)
def test_ipmitool_listing_yields_the_servers_power_sensor(path: Path) -> None:
    rows = parse_ipmitool_sdr_elist(path.read_text())
    assert len(rows) == len([line for line in path.read_text().splitlines() if line.strip()])
    _expect(rows, path.stem)


@pytest.mark.parametrize("path", FREEIPMI_FIXTURES, ids=lambda p: p.stem)
def test_freeipmi_listing_yields_the_servers_power_sensor(path: Path) -> None:
    _expect(parse_freeipmi_sensors(path.read_text()), path.stem)


def test_a_sensor_without_reading_is_kept_without_a_value() -> None:
    rows = parse_ipmitool_sdr_elist((IPMITOOL_FIXTURES[0].parent / "bmc-sim-pyghmi.txt").read_text())
    ps2 = next(r for r in rows if r.name == "PS2 Input Power")
    assert (ps2.status, ps2.value) == ("ns", None)
    current = next(r for r in rows if r.name == "Current 1")
    assert (current.value, current.unit) == (0.60, "Amps")


def test_sensor_reading_output_is_parsed_by_name() -> None:
    assert parse_ipmitool_sensor_reading("Pwr Consumption  | 230\nPS1 Input Power  | 124.5\n") == {
        "Pwr Consumption": 230.0,
        "PS1 Input Power": 124.5,
    }


def _w(name: str, watts: float | None, unit: str = "Watts") -> SensorReading:
    return SensorReading(name, "01h", "ok" if watts is not None else "ns", watts, unit if watts is not None else "")


@pytest.mark.parametrize(
    ("sensors", "wanted", "chosen"),
    [
        ([_w("Power Supply 1", 90), _w("Power Meter", 183)], None, ("Power Meter",)),
        (
            [_w("PS1 Input Power", 120), _w("PS1 Output Power", 110), _w("PS2 Input Power", 118)],
            None,
            ("PS1 Input Power", "PS2 Input Power"),
        ),
        ([_w("PSU1_PIN", 100), _w("PSU2_PIN", 101)], None, ("PSU1_PIN", "PSU2_PIN")),
        ([_w("CPU Power", 80), _w("Pwr Consumption", 200)], ["CPU Power"], ("CPU Power",)),
        ([_w("Pwr Consumption", None), _w("Total Power", 190)], None, ("Total Power",)),
    ],
    ids=[
        "a platform meter wins over power supplies",
        "power-supply inputs are summed, outputs ignored",
        "Gigabyte-style PSUn_PIN inputs are summed",
        "a configured sensor is used as named",
        "a meter without a reading is passed over",
    ],
)
def test_sensor_choice(sensors: list[SensorReading], wanted: list[str] | None, chosen: tuple[str, ...]) -> None:
    got, _ = choose_sensors(sensors, wanted)
    assert tuple(s.name for s in got) == chosen


@pytest.mark.parametrize(
    ("wanted", "message"),
    [
        (["Nope"], r"'Nope' \(option sensors\) not in the SDR; watt sensors present: 'Power Meter'"),
        (["Inlet Temp"], r"'Inlet Temp' \(option sensors\) do not read in watts"),
    ],
    ids=["an unknown configured sensor is named with the ones present", "a configured sensor must read watts"],
)
def test_configured_sensors_are_checked(wanted: list[str], message: str) -> None:
    sensors = [_w("Power Meter", 183), _w("Inlet Temp", 21, "degrees C")]
    with pytest.raises(ValueError, match=message):
        choose_sensors(sensors, wanted)


def test_invalid_sensors_option_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceFailed, match="sensors: must be a non-empty list"):
        ipmi_sdr.open_source({"sensors": "Pwr Consumption"}, Roots(dev=str(tmp_path)))


# --- the real tools against the simulated BMC ----------------------------------------------------

PSU_ONLY = [
    {
        "name": "PS1 Input Power",
        "number": 80,
        "type": "power_supply",
        "unit": "Watts",
        "m": 2,
        "raw": 62,
        "entity": 10,
        "instance": 1,
    },
    {
        "name": "PS2 Input Power",
        "number": 81,
        "type": "power_supply",
        "unit": "Watts",
        "m": 2,
        "raw": 59,
        "entity": 10,
        "instance": 2,
    },
    {
        "name": "PS1 Output Power",
        "number": 82,
        "type": "power_supply",
        "unit": "Watts",
        "m": 2,
        "raw": 55,
        "entity": 10,
        "instance": 1,
    },
]
NO_POWER = [s for s in DELL_LIKE_SENSORS if s["unit"] != "Watts"]


@needs_ipmitool
def test_real_ipmitool_reads_the_platform_meter_through_a_local_sdr_cache(start_bmc, password_file: Path) -> None:
    bmc = start_bmc(dcmi={"mode": "deactivated"})  # the case this source exists for
    source = ipmi_sdr.open_source(remote_options(bmc, password_file, tool="ipmitool"), Roots())
    try:
        assert isinstance(source, Source)
        (zone,) = source.zones()
        assert (zone.name, zone.kind, zone.domain, zone.sensors) == (
            "platform",
            "power",
            "platform",
            ("Pwr Consumption",),
        )
        assert source.sdr_cache is not None and Path(source.sdr_cache).stat().st_size > 0
        assert zone.read().value == 230  # raw 115 × M 2: the tool's linearisation, not ours
        bmc.set_sensor("Pwr Consumption", 150)
        assert zone.read().value == 300
    finally:
        source.close()


@needs_ipmitool
def test_real_ipmitool_sums_power_supply_inputs(start_bmc, password_file: Path) -> None:
    bmc = start_bmc(dcmi={"mode": "unsupported"}, sensors=PSU_ONLY)
    source = ipmi_sdr.open_source(remote_options(bmc, password_file, tool="ipmitool"), Roots())
    assert source.zones()[0].read().value == (62 + 59) * 2


@needs_ipmitool
def test_real_ipmitool_without_a_power_sensor_is_absent_and_lists_what_it_saw(start_bmc, password_file: Path) -> None:
    bmc = start_bmc(sensors=NO_POWER)
    with pytest.raises(SourceAbsent, match=r"no whole-server power sensor .*watt sensors present: none"):
        ipmi_sdr.open_source(remote_options(bmc, password_file, tool="ipmitool"), Roots())


@needs_ipmitool
def test_a_chosen_sensor_that_loses_its_reading_fails_the_read(start_bmc, password_file: Path) -> None:
    bmc = start_bmc()
    source = ipmi_sdr.open_source(remote_options(bmc, password_file, tool="ipmitool"), Roots())
    bmc.set_sensor("Pwr Consumption", None)
    with pytest.raises(SourceFailed, match=r"sensor 'Pwr Consumption' gave no reading"):
        source.zones()[0].read()


@needs_freeipmi
def test_real_freeipmi_reads_the_same_sensor_by_record_id(start_bmc, password_file: Path) -> None:
    bmc = start_bmc(dcmi={"mode": "deactivated"})
    source = ipmi_sdr.open_source(remote_options(bmc, password_file, tool="freeipmi"), Roots())
    try:
        assert source.zones()[0].read().value == 230
        bmc.set_sensor("Pwr Consumption", 100)
        time.sleep(1.1)  # a second turns between reads, as between an agent's: the SDR cache holds
        assert source.zones()[0].read().value == 200
    finally:
        source.close()


def test_sdr_type_current_output_reads_like_elist() -> None:
    """``ipmitool sdr type Current`` (captured from the simulated BMC): on Dells the power meter is a
    Current-type sensor reading in watts."""
    text = "Current 1        | 6Ah | ok  | 10.1 | 0.60 Amps\nPwr Consumption  | 77h | ok  |  7.1 | 230 Watts\n"
    chosen, why = choose_sensors(parse_ipmitool_sdr_elist(text), None)
    assert [(s.name, s.value) for s in chosen] == [("Pwr Consumption", 230.0)]
    assert why == "platform meter 'Pwr Consumption'"
