"""A small BMC on loopback for the real ``ipmitool`` and FreeIPMI tools (test helper, not a test).

Built on pyghmi's :class:`pyghmi.ipmi.bmc.Bmc`, which serves IPMI 2.0 / RMCP+ (lanplus, cipher
suite 3) on UDP. On top of what pyghmi answers (Get Device ID, chassis, sessions) it answers:

* DCMI Get Power Reading (NetFn 0x2C, cmd 0x02, group extension 0xDC) — current, minimum,
  maximum and average watts, IPMI timestamp, statistics period in ms, and the state byte whose
  bit 6 says "power measurement active"; mode ``deactivated`` answers zeros with bit 6 clear
  (what a BMC without a DCMI power meter sends), mode ``unsupported`` answers completion code
  0xC1 (invalid command);
* Get DCMI Capabilities (cmd 0x01) — DCMI 1.5, power management supported;
* the SDR repository (NetFn 0x0A: Get SDR Repository Info 0x20, Reserve 0x22, Get SDR 0x23) with
  full sensor records (type 0x01) built from the state file, and Get Sensor Reading (NetFn 0x04,
  cmd 0x2D), so ``ipmitool sdr elist`` and ``ipmi-sensors`` read real linearised sensors.

The state is a JSON file re-read on every request, so a test can change the watts between two
reads. Run as ``python bmc_sim.py STATE_FILE [PORT]``: it binds 127.0.0.1 on PORT (default a
free UDP port; give the old one to restart a killed BMC) and prints ``PORT <n>`` on stdout once
it listens. Users and passwords come from the state file.
"""

from __future__ import annotations

import json
import struct
import sys
import time
from typing import Any

import pyghmi.ipmi.bmc as bmc

IPMI_DCMI = 0xDC
NETFN_DCGRP = 0x2C
NETFN_STORAGE = 0x0A
NETFN_SENSOR = 0x04
NETFN_APP = 0x06

# IPMI 2.0 table 43-15 sensor unit type codes and table 42-3 sensor type codes used here.
UNITS = {"degrees C": 1, "Volts": 4, "Amps": 5, "Watts": 6, "RPM": 18}
SENSOR_TYPES = {"temperature": 0x01, "voltage": 0x02, "current": 0x03, "fan": 0x04, "power_supply": 0x08, "other": 0x0B}


def full_sensor_record(record_id: int, sensor: dict[str, Any]) -> bytes:
    """An SDR type 0x01 (full sensor record, IPMI 2.0 table 43-1), linear, unsigned."""
    name = sensor["name"].encode("ascii")[:16]
    m = int(sensor.get("m", 1))
    r_exp = int(sensor.get("r_exp", 0)) & 0x0F
    body = (
        bytes(
            [
                0x20,  # sensor owner id: BMC
                0x00,  # owner LUN
                sensor["number"],
                sensor.get("entity", 0x07),  # entity id (7 = system board, 10 = power supply)
                sensor.get("instance", 1),
                0x7F,  # initialisation: scanning, events, thresholds, hysteresis, type
                0x68,  # capabilities: auto re-arm, readable thresholds
                SENSOR_TYPES[sensor["type"]],
                0x01,  # event/reading type: threshold
                0x00,
                0x00,  # assertion mask / lower threshold reading mask
                0x00,
                0x00,  # deassertion mask / upper threshold reading mask
                0x00,
                0x00,  # discrete reading mask / settable & readable thresholds
                0x00,  # units 1: unsigned, no rate, no modifier
                UNITS[sensor["unit"]],
                0x00,  # modifier unit
                0x00,  # linearisation: linear
                m & 0xFF,
                (m >> 8 & 0x03) << 6,  # M ms bits, tolerance 0
                0x00,  # B ls
                0x00,  # B ms, accuracy ls
                0x00,  # accuracy ms, accuracy exp, direction
                r_exp << 4,  # R exponent (signed nibble), B exponent 0
                0x00,  # analog characteristics
                0x00,
                0xFF,
                0x00,  # nominal, normal max, normal min
                0xFF,
                0x00,  # sensor max, sensor min
                0x00,
                0x00,
                0x00,
                0x00,
                0x00,
                0x00,  # thresholds (none readable)
                0x00,
                0x00,  # hysteresis
                0x00,
                0x00,  # reserved
                0x00,  # OEM
                0xC0 | len(name),  # 8-bit ASCII + Latin-1 id string
            ]
        )
        + name
    )
    header = struct.pack("<HBBB", record_id, 0x51, 0x01, len(body))
    return header + body


class SimBmc(bmc.Bmc):
    def __init__(self, state_file: str, port: int = 0) -> None:
        self.state_file = state_file
        state = self.state()
        super().__init__(state["users"], port=port, address="127.0.0.1")
        # pyghmi keys its sessions by the port number it was given: tell it the one bound.
        self.port = self.serversocket.getsockname()[1]
        self.additionaldevices = 0x02  # "SDR repository device": ipmitool reads the repository
        self.mfgid = 674  # any IANA number; 674 is Dell
        self.requests: list[str] = []
        # The repository's most recent addition: when its records last changed, not the time of
        # asking (a clock there made FreeIPMI's SDR cache "out of date" once a second turned).
        self.sdr_records: list[bytes] = []
        self.sdr_added = 0

    def state(self) -> dict[str, Any]:
        with open(self.state_file, encoding="utf-8") as fh:
            return json.load(fh)

    def records(self) -> list[bytes]:
        sensors = self.state().get("sensors", [])
        return [full_sensor_record(i + 1, s) for i, s in enumerate(sensors)]

    def handle_raw_request(self, request: dict[str, Any], session: Any) -> None:
        netfn, command, data = request["netfn"], request["command"], list(request["data"])
        try:
            if netfn == NETFN_DCGRP and data[:1] == [IPMI_DCMI]:
                return self.dcmi(command, data, session)
            if netfn == NETFN_STORAGE:
                return self.storage(command, data, session)
            if netfn == NETFN_SENSOR and command == 0x2D:
                return self.sensor_reading(data, session)
        except Exception:  # never kill the BMC loop on a malformed request
            return session.send_ipmi_response(code=0xFF)
        return super().handle_raw_request(request, session)

    def dcmi(self, command: int, data: list[int], session: Any) -> None:
        dcmi = self.state().get("dcmi", {})
        mode = dcmi.get("mode", "active")
        if command == 0x01:  # Get DCMI Capabilities, parameter 1: supported capabilities
            if mode == "unsupported":
                return session.send_ipmi_response(code=0xC1)
            return session.send_ipmi_response(data=[IPMI_DCMI, 1, 5, 2, 0x00, 0x01, 0x00])
        if command != 0x02:
            return session.send_ipmi_response(code=0xC1)
        if mode == "unsupported":
            return session.send_ipmi_response(code=0xC1)
        if mode == "deactivated":
            payload = struct.pack("<HHHHIIB", 0, 0, 0, 0, 0, 0, 0x00)
        else:
            payload = struct.pack(
                "<HHHHIIB",
                int(dcmi.get("current", 0)),
                int(dcmi.get("minimum", 0)),
                int(dcmi.get("maximum", 0)),
                int(dcmi.get("average", 0)),
                int(dcmi.get("timestamp", time.time())),
                int(dcmi.get("period_ms", 0)),
                0x40,  # bit 6: power measurement active
            )
        return session.send_ipmi_response(data=[IPMI_DCMI, *payload])

    def storage(self, command: int, data: list[int], session: Any) -> None:
        records = self.records()
        if command == 0x20:  # Get SDR Repository Info
            free = 0x1000
            if records != self.sdr_records:
                self.sdr_records, self.sdr_added = records, int(time.time())
            info = struct.pack("<BHHIIB", 0x51, len(records), free, self.sdr_added, 0, 0x02)
            return session.send_ipmi_response(data=list(info))
        if command == 0x22:  # Reserve SDR Repository
            return session.send_ipmi_response(data=[0x01, 0x00])
        if command == 0x23:  # Get SDR: reservation(2), record id(2), offset(1), bytes(1)
            record_id = data[2] | data[3] << 8
            offset, count = data[4], data[5]
            index = 0 if record_id == 0 else record_id - 1
            if index >= len(records):
                return session.send_ipmi_response(code=0xCB)  # requested data not present
            record = records[index]
            next_id = index + 2 if index + 1 < len(records) else 0xFFFF
            chunk = record[offset : offset + (len(record) if count == 0xFF else count)]
            return session.send_ipmi_response(data=[next_id & 0xFF, next_id >> 8, *chunk])
        return session.send_ipmi_response(code=0xC1)

    def sensor_reading(self, data: list[int], session: Any) -> None:
        for sensor in self.state().get("sensors", []):
            if sensor["number"] == data[0]:
                raw = sensor.get("raw")
                if raw is None:  # reading unavailable
                    return session.send_ipmi_response(data=[0x00, 0x60, 0x00])
                return session.send_ipmi_response(data=[int(raw) & 0xFF, 0x40, 0x00])
        return session.send_ipmi_response(code=0xCB)


def main(argv: list[str]) -> int:
    sim = SimBmc(argv[1], int(argv[2]) if len(argv) > 2 else 0)
    print(f"PORT {sim.port}", flush=True)
    sim.listen()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
