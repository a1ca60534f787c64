"""Provider-mode configuration, host inventory from replica trees, and the snapshot adapter."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from joulesched.measurement.nadiki import counter_samples, parse_provider_config
from joulesched.measurement.nadiki.config import DEFAULT_FIELDS
from joulesched.measurement.nadiki.inventory import discover
from joulesched.measurement.snapshot import ZoneSnapshot
from joulesched.measurement.sources.base import Roots
from joulesched.policy.errors import ConfigError


def test_the_smallest_config_takes_every_default() -> None:
    config = parse_provider_config(
        {"registrar_url": "https://registry.example/v1", "server": {"facility_id": "F", "rack_id": "R"}}
    )
    assert (config.precision, config.state_file, config.discover) == (
        "s",
        "/var/lib/joulesched/nadiki-server.json",
        True,
    )
    assert config.server.cooling_type == "air"
    assert config.fields == DEFAULT_FIELDS


def test_every_problem_is_reported_at_once_with_its_path() -> None:
    with pytest.raises(ConfigError) as info:
        parse_provider_config(
            {
                "registrar_url": "ftp://registry",
                "precision": "h",
                "max_backlog_lines": "100",
                "fields": {"server_energy_consumption_joules": "ipmi_dcmi"},
                "colour": "blue",
                "server": {
                    "rack_id": "R",
                    "cooling_type": "water",
                    "total_cpu_sockets": 0,
                    "storage_devices": [{"vendor": "X", "capacity": -1, "type": "tape"}],
                    "installed_cpus": [{"vendor": "Intel"}],
                    "rated_power": "1 kW",
                },
            }
        )
    problems = "\n".join(info.value.problems)
    for expected in [
        "nadiki.registrar_url: must be an http:// or https:// URL",
        "nadiki.precision: must be one of s, ms, us, ns, got 'h'",
        "nadiki.max_backlog_lines: must be an integer, got '100'",
        "nadiki.fields.server_energy_consumption_joules: must be a non-empty list of source names",
        "nadiki.colour: unknown field",
        "nadiki.server.facility_id: is required",
        "nadiki.server.cooling_type: must be one of direct-to-chip, immersion, back-door-liquid, back-door-fan, air",
        "nadiki.server.total_cpu_sockets: must be >= 1, got 0",
        "nadiki.server.storage_devices[0].capacity: must be > 0",
        "nadiki.server.storage_devices[0].type: must be one of NVMe, SSD, HDD, Other",
        "nadiki.server.installed_cpus[0].type: is required",
        "nadiki.server.rated_power: must be a number",
    ]:
        assert expected in problems


def test_an_arm_host_without_memory_blocks_is_described_as_far_as_it_can_be(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(
        "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n\n"
        "processor\t: 1\nCPU implementer\t: 0x41\n"
    )
    (proc / "meminfo").write_text("MemTotal:       263680000 kB\n")
    facts = discover(Roots(sysfs=str(tmp_path / "sys"), procfs=str(proc)))
    assert facts.cpus == () and facts.memory_gb == 252
    notes = " | ".join(facts.notes)
    assert "names no CPU vendor or model" in notes and "estimated from MemTotal" in notes


def _zone(source: str, zone: str, domain: str, joules: float, parent: str | None = None) -> ZoneSnapshot:
    return ZoneSnapshot(source, zone, domain, "counter", parent, None, joules, 100.0, True)


def test_snapshot_totals_per_source_never_count_a_part_on_top_of_its_whole() -> None:
    snapshot = SimpleNamespace(
        wall_time=1_767_268_830.5,
        sources=(),
        discarded=(),
        estimated=(),
        zones=(
            _zone("rapl_sysfs", "package-0", "package", 1000.0),
            _zone("rapl_sysfs", "package-1", "package", 900.0),
            _zone("rapl_sysfs", "dram-0", "dram", 100.0),
            _zone("rapl_sysfs", "core-0", "core", 700.0, parent="package-0"),
            _zone("rapl_sysfs", "psys", "psys", 5000.0),
            _zone("ipmi_dcmi", "platform", "platform", 4000.0),
            _zone("redfish", "chassis-Enclosure", "platform", 40_000.0),
            _zone("redfish", "chassis-Blade3", "platform", 4100.0, parent="chassis-Enclosure"),
            _zone("redfish", "chassis-Enclosure-energy", "platform", 40_010.0, parent="chassis-Enclosure"),
            _zone("nvml", "gpu-0", "gpu", 300.0),
        ),
    )
    got = {s.source: s.joules_total for s in counter_samples(snapshot)}
    assert got == {"rapl_sysfs": 2000.0, "ipmi_dcmi": 4000.0, "redfish": 40_000.0, "nvml": 300.0}
    assert {s.timestamp for s in counter_samples(snapshot)} == {1_767_268_830.5}


def test_the_shipped_provider_example_is_valid() -> None:
    import yaml

    from joulesched.measurement.sources.ipmi_dcmi import TARGET_OPTIONS
    from joulesched.measurement.sources.nvml import OPTIONS as NVML_OPTIONS
    from joulesched.measurement.sources.redfish import OPTIONS as REDFISH_OPTIONS

    example = yaml.safe_load(
        (Path(__file__).resolve().parents[3] / "deploy" / "provider" / "provider.yaml").read_text()
    )
    config = parse_provider_config(example["nadiki"])
    assert config.server.facility_id and config.fields["server_energy_consumption_joules"][0] == "ipmi_dcmi"
    known = {
        "ipmi_dcmi": TARGET_OPTIONS,
        "ipmi_sdr": TARGET_OPTIONS | {"sensors"},
        "redfish": REDFISH_OPTIONS,
        "nvml": NVML_OPTIONS,
    }
    for name, options in example["sources"]["options"].items():
        assert set(options) <= known[name], f"{name}: {set(options) - known[name]}"


def test_more_cpus_than_sockets_is_refused_and_fewer_is_an_empty_socket() -> None:
    cpu = {"vendor": "Intel", "type": "Xeon Gold 6338", "physical_core_count": 32}
    server = {"facility_id": "F", "rack_id": "R", "discover": False, "total_cpu_sockets": 1, "installed_cpus": [cpu, cpu]}
    with pytest.raises(ConfigError) as info:
        parse_provider_config({"registrar_url": "https://registry.example/v1", "server": server})
    assert "nadiki.server.installed_cpus: lists 2 CPUs for 1 sockets (total_cpu_sockets): one entry per CPU installed" in (
        info.value.problems
    )
    one_of_two = parse_provider_config(
        {"registrar_url": "https://registry.example/v1", "server": {**server, "total_cpu_sockets": 2, "installed_cpus": [cpu]}}
    )
    assert len(one_of_two.server.installed_cpus) == 1


def test_a_source_that_is_not_being_read_gives_no_sample_and_the_next_source_fills_its_windows() -> None:
    """IPMI down for 90 s: its total stands still; the windows of that time come from Redfish, not
    as 0 J from IPMI (docs/provider.md)."""
    from joulesched.measurement.meter import EnergyMeter
    from joulesched.measurement.nadiki.model import DataPoint, TimeSeriesConfig
    from joulesched.measurement.nadiki.pusher import Pusher
    from tests.measurement.fakes import FakeSource, FakeZone
    from tests.support import Clock

    t0 = 1_767_268_805.0
    clock = Clock(t0)
    ipmi = FakeSource("ipmi_dcmi", [FakeZone("platform", "platform", "power", clock, 250.0)])
    redfish = FakeSource("redfish", [FakeZone("chassis-1", "platform", "power", clock, 260.0)])
    meter = EnergyMeter([ipmi, redfish], clock=clock, max_gap_seconds=30.0)
    field = "server_energy_consumption_joules"
    tags = {"facility_id": "F", "rack_id": "R", "server_id": "S", "country_code": "NLD"}
    written: list[str] = []
    pusher = Pusher(
        TimeSeriesConfig("http://unused", "o", "b", "t", (DataPoint("server", field, 30, tags),)),
        {field: ("ipmi_dcmi", "redfish")},
        writer=written.extend,
        clock=clock,
    )
    for i in range(200):
        clock.now = t0 + i
        ipmi.zone("platform").fail = "ipmi_dcmi: no answer within 15 s" if 60 <= i < 150 else ""
        meter.read()
        zones = tuple(
            ZoneSnapshot(z.source, z.zone, z.domain, z.kind, z.parent, z.max_joules, nj / 1e9, watts, present)
            for z, nj, present, watts, _ in meter.zone_states()
        )
        discarded = tuple((s, z, k, sec) for (s, z, k), sec in meter.discarded_seconds.items())
        read = SimpleNamespace(wall_time=clock.now, zones=zones, sources=meter.source_snapshots(), discarded=discarded, estimated=())
        for sample in counter_samples(read):
            pusher.add(sample)
        pusher.flush()
    joules = {int(line.rsplit(" ", 1)[1]): float(line.split(" ")[1].split("=")[1]) for line in written}
    assert joules[1_767_268_830] == pytest.approx(7500.0), "IPMI while it answered"
    assert [joules[s] for s in (1_767_268_890, 1_767_268_920)] == [pytest.approx(7800.0)] * 2, "Redfish while IPMI was down"
    assert all(j > 7000.0 for j in joules.values()), sorted(joules.items())
