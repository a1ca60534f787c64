"""Registration against the spec's schemas and a registrar on loopback; the provider end to end."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from joulesched.measurement.nadiki import CounterSample, Provider, RegistrationFailed, parse_provider_config
from joulesched.measurement.nadiki.model import Processor, ServerDescription, StorageDevice, parse_registration
from joulesched.measurement.sources.base import Roots
from tests.measurement.nadiki.nadiki_support import (
    Registrar,
    RegistrarServer,
    needs_spec,
    schema_errors,
    undeclared_keys,
)

pytestmark = needs_spec

FULL = ServerDescription(
    facility_id="FACILITY-NLD-001",
    rack_id="RACK-001",
    cooling_type="direct-to-chip",
    rated_power=1.6,
    total_cpu_sockets=2,
    installed_cpus=(Processor("Intel", "Xeon Gold 6338", 32), Processor("Intel", "Xeon Gold 6338", 32)),
    number_of_psus=2,
    total_installed_memory=512,
    number_of_memory_units=16,
    storage_devices=(StorageDevice("Samsung", 3.84, "NVMe"), StorageDevice("Seagate", 4.0, "HDD")),
    installed_gpus=(Processor("NVIDIA", "H100 80GB HBM3"),) * 4,
    installed_fpgas=(Processor("Xilinx", "Alveo U55C"),),
    product_passport={"source": "Boavizta", "gwp_kgco2e": 1520},
    description="GPU node 7, row 3",
)


@pytest.mark.parametrize(
    "description",
    [ServerDescription("FACILITY-NLD-001", "RACK-001"), FULL],
    ids=["the minimal description (required fields only)", "every field the spec defines"],
)
@pytest.mark.parametrize("schema", ["ServerCreate", "ServerUpdate"])
def test_request_bodies_validate_against_the_spec(description: ServerDescription, schema: str) -> None:
    body = description.to_request()
    assert schema_errors(schema, body) == []
    assert undeclared_keys(schema, body) == [], "every key we send is one the spec declares"
    assert None not in body.values(), "unknown values are left out, never sent as null"


def test_the_validator_does_catch_a_wrong_body() -> None:
    """Negative control: the schema check is not vacuous."""
    body = {**FULL.to_request(), "cooling_type": "water", "total_cpu_sockets": 0}
    body["storage_devices"] = [{"vendor": "X", "capacity": 1, "type": "tape"}]
    errors = " | ".join(schema_errors("ServerCreate", body))
    assert "'water' is not one of" in errors and "0 is less than the minimum of 1" in errors and "'tape'" in errors
    assert undeclared_keys("ServerCreate", {**body, "ratedPower": 1}) == ["ratedPower"]


def test_the_registrars_answer_validates_once_the_specs_pattern_delimiters_are_removed() -> None:
    """The spec writes ``pattern: /^(cpu_…|server_…)$/``; JSON Schema patterns carry no delimiters,
    so as written no valid field name matches. Provider mode does not check the pattern."""
    answer = Registrar().response_for("SERVER-F-R-001", FULL.to_request(), "http://influx:8086")
    assert schema_errors("ServerResponse", answer, fix_patterns=True) == []
    as_written = schema_errors("ServerResponse", answer)
    assert as_written and all("does not match '/^(cpu_energy" in e for e in as_written)
    registration = parse_registration(answer, "test")
    assert registration.server_id == "SERVER-F-R-001"
    assert [p.field for p in registration.time_series.data_points] == [
        "server_energy_consumption_joules",
        "cpu_energy_consumption_joules",
    ]


def test_an_answer_off_the_spec_is_refused_with_every_problem() -> None:
    answer: dict[str, Any] = {
        "id": "S",
        "timeSeriesConfig": {
            "endpoint": "http://x",
            "org": "o",
            "bucket": "b",
            "dataPoints": [
                {"measurement": "server", "field": "f", "granularitySeconds": 0, "tags": {"facility_id": "F"}}
            ],
        },
    }
    with pytest.raises(ValueError) as info:
        parse_registration(answer, "registrar")
    message = str(info.value)
    assert "timeSeriesConfig.token" in message and "granularitySeconds" in message
    assert "missing rack_id, server_id, country_code" in message


# --- the provider against the registrar on loopback ------------------------------------------------


def replica_host(root: Path) -> Roots:
    """A two-socket Xeon host: 2 × 2 cores × 2 threads, 512 GB in 2 GiB blocks, an NVMe and an HDD."""
    sysfs, procfs = root / "sys", root / "proc"
    cpuinfo = []
    for cpu in range(8):
        package, core = cpu // 4, (cpu % 4) // 2
        topo = sysfs / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
        cpuinfo.append(
            f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6338 CPU "
            f"@ 2.00GHz\nphysical id\t: {package}\ncore id\t\t: {core}\ncpu cores\t: 2\n"
        )
    procfs.mkdir()
    (procfs / "cpuinfo").write_text("\n".join(cpuinfo))
    (procfs / "meminfo").write_text("MemTotal:       527997112 kB\n")
    memory = sysfs / "devices" / "system" / "memory"
    memory.mkdir(parents=True)
    (memory / "block_size_bytes").write_text("80000000\n")
    for i in range(256):
        (memory / f"memory{i}").mkdir()
    disks = {
        "nvme0n1": {"size": "7501476528", "queue/rotational": "0", "device/model": "SAMSUNG MZQL23T8HCLS-00A07"},
        "sda": {
            "size": "7814037168",
            "queue/rotational": "1",
            "device/vendor": "ATA",
            "device/model": "ST4000NM0035-1V4",
        },
        "loop0": {"size": "1024"},
        "sdb": {"size": "60000000", "removable": "1"},
    }
    for name, files in disks.items():
        for rel, text in files.items():
            path = sysfs / "block" / name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text + "\n")
    return Roots(sysfs=str(sysfs), procfs=str(procfs))


def provider_config(server: RegistrarServer, state_file: Path, **server_fields: Any) -> Any:
    return parse_provider_config(
        {
            "registrar_url": server.registrar_url,
            "state_file": str(state_file),
            "server": {
                "facility_id": "FACILITY-NLD-001",
                "rack_id": "RACK-001",
                "cooling_type": "air",
                "number_of_psus": 2,
                **server_fields,
            },
        }
    )


def test_first_start_registers_the_discovered_server_and_keeps_the_id(tmp_path: Path) -> None:
    roots = replica_host(tmp_path)
    state_file = tmp_path / "state" / "nadiki-server.json"
    with RegistrarServer() as server:
        provider = Provider(provider_config(server, state_file), roots, gpu_models=["NVIDIA H100 80GB HBM3"])
        registration = provider.register()
        assert server.state.body_errors == []
        ((method, path, body),) = server.state.requests
        assert (method, path) == ("POST", "/servers")
        assert (
            body["installed_cpus"]
            == [{"vendor": "Intel", "type": "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz", "physical_core_count": 2}] * 2
        )
        assert (body["total_cpu_sockets"], body["total_installed_memory"]) == (2, 512)
        assert body["storage_devices"] == [
            {"vendor": "SAMSUNG", "capacity": 3.841, "type": "NVMe"},
            {"vendor": "ST4000NM0035-1V4", "capacity": 4.001, "type": "HDD"},
        ]
        assert body["installed_gpus"] == [{"vendor": "NVIDIA", "type": "NVIDIA H100 80GB HBM3"}]
        assert registration.server_id == "SERVER-FACILITY-NLD-001-RACK-001-001"
        saved = json.loads(state_file.read_text())
        assert saved["id"] == registration.server_id and saved["registrar"] == server.registrar_url
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600, "the state holds the time-series token"


def test_later_starts_reuse_the_id_update_a_changed_server_and_survive_an_outage(tmp_path: Path) -> None:
    roots = replica_host(tmp_path)
    state_file = tmp_path / "nadiki-server.json"
    with RegistrarServer() as server:
        first = Provider(provider_config(server, state_file), roots).register()
        server.state.token = "token-2"
        again = Provider(provider_config(server, state_file), roots).register()
        assert again.server_id == first.server_id
        assert again.time_series.token == "token-2", "the current token comes from GET /servers/{id}"
        assert [m for m, _, _ in server.state.requests] == ["POST", "GET"]

        grown = Provider(provider_config(server, state_file, number_of_memory_units=16), roots).register()
        assert grown.server_id == first.server_id
        assert server.state.requests[-1][0] == "PUT" and server.state.body_errors == []

        server.state.down = True
        stored = Provider(provider_config(server, state_file, number_of_memory_units=16), roots).register()
        assert stored.server_id == first.server_id, "the registrar down: push with the stored config"
        server.state.down = False

        server.state.servers.clear()  # the registrar forgot it
        fresh = Provider(provider_config(server, state_file, number_of_memory_units=16), roots).register()
        assert server.state.requests[-1][0] == "POST" and fresh.server_id.endswith("-001")


def test_a_server_moved_to_another_rack_is_registered_anew(tmp_path: Path) -> None:
    roots = replica_host(tmp_path)
    state_file = tmp_path / "nadiki-server.json"
    with RegistrarServer() as server:
        Provider(provider_config(server, state_file), roots).register()
        config = parse_provider_config(
            {
                "registrar_url": server.registrar_url,
                "state_file": str(state_file),
                "server": {"facility_id": "FACILITY-NLD-001", "rack_id": "RACK-009"},
            }
        )
        moved = Provider(config, roots).register()
        assert moved.server_id == "SERVER-FACILITY-NLD-001-RACK-009-002"
        assert [m for m, _, _ in server.state.requests] == ["POST", "POST"]


def test_a_rejected_registration_names_the_registrar_and_the_fix(tmp_path: Path) -> None:
    with RegistrarServer() as server:
        config = provider_config(server, tmp_path / "s.json", discover=False)
        server.state.down = True
        with pytest.raises(RegistrationFailed, match=r"registrar http://127.0.0.1:\d+/v1: POST /servers: HTTP 503"):
            Provider(config, Roots()).register()


def test_end_to_end_counters_become_lines_at_the_endpoint_the_registrar_named(tmp_path: Path) -> None:
    roots = replica_host(tmp_path)
    with RegistrarServer() as server:
        now = {"t": 1_767_268_801.0}
        provider = Provider(provider_config(server, tmp_path / "s.json"), roots, clock=lambda: now["t"])
        registration = provider.register()

        def samples() -> Any:
            for i in range(70):
                now["t"] = 1_767_268_801.0 + i
                yield CounterSample(now["t"], "ipmi_dcmi", 300.0 * i)
                yield CounterSample(now["t"], "rapl_sysfs", 140.0 * i)
                yield CounterSample(now["t"], "nvml", 500.0 * i)  # not a field of the spec: ignored

        provider.run(samples())
        assert server.state.line_errors == []
        lines = sorted((p.timestamp, *p.fields.items()) for p in server.state.lines)
        assert lines == [
            (1_767_268_830, ("cpu_energy_consumption_joules", pytest.approx(4200.0))),
            (1_767_268_830, ("server_energy_consumption_joules", pytest.approx(9000.0))),
        ]
        assert all(
            p.tags["server_id"] == registration.server_id and p.tags["country_code"] == "NLD"
            for p in server.state.lines
        )
