"""RAPL through powercap sysfs, against replicas of the kernel's tree."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources import rapl_sysfs
from joulesched.measurement.sources.base import Roots, Source, Zone
from tests.measurement.replica import PowercapTree


def zones_by_name(source: Source) -> dict[str, Zone]:
    return {z.name: z for z in source.zones()}


def deny(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Make ``path`` unreadable as it is for non-root since Linux 5.10 (mode 0400 root).

    The tests run as root in CI containers, where ``chmod 000`` does not stop root (it has
    CAP_DAC_OVERRIDE). So besides the chmod (effective when the suite runs unprivileged),
    ``os.open`` is wrapped to raise EACCES for that one path, exactly what the kernel returns.
    """
    path.chmod(0)
    real_open = os.open
    target = os.path.realpath(path)

    def guarded(file: str | os.PathLike[str], flags: int, *args: int, **kwargs: int) -> int:
        if os.path.realpath(os.fspath(file)) == target and flags & os.O_ACCMODE == os.O_RDONLY:
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded)


def test_two_socket_server_lists_packages_cores_and_dram_with_parents(powercap: PowercapTree, roots: Roots) -> None:
    powercap.server(sockets=2)
    zones = zones_by_name(rapl_sysfs.open_source({}, roots))
    assert sorted(zones) == ["core-0", "core-1", "dram-0", "dram-1", "package-0", "package-1"]
    assert zones["package-1"].domain == "package" and zones["package-1"].parent is None
    assert zones["core-1"].parent == "package-1"  # part of the package: never added on top
    assert zones["dram-1"].parent is None  # a separate plane: added to the package
    assert zones["dram-0"].domain == "dram"
    assert zones["package-0"].max_joules == pytest.approx(262143.328850)
    assert all(z.kind == "counter" for z in zones.values())


def test_reading_converts_microjoules_to_joules(powercap: PowercapTree, roots: Roots) -> None:
    powercap.add("intel-rapl:0", "package-0", energy_uj=123_456_789)
    zone = zones_by_name(rapl_sysfs.open_source({}, roots, clock=lambda: 42.0))["package-0"]
    reading = zone.read()
    assert reading.value == pytest.approx(123.456789)
    assert reading.timestamp == 42.0


def test_amd_zen_tree_is_the_same_shape(powercap: PowercapTree, roots: Roots) -> None:
    # Linux >= 5.8 on Zen: package-N with a core sub-zone, no DRAM, smaller range.
    powercap.add("intel-rapl:0", "package-0", max_uj=65532610987)
    powercap.add("intel-rapl:0:0", "core", max_uj=65532610987)
    zones = zones_by_name(rapl_sysfs.open_source({}, roots))
    assert set(zones) == {"package-0", "core-0"}
    assert zones["core-0"].parent == "package-0"


def test_mmio_duplicate_of_a_package_is_skipped(powercap: PowercapTree, roots: Roots) -> None:
    powercap.add("intel-rapl:0", "package-0")
    powercap.add("intel-rapl:0:0", "core")
    powercap.add("intel-rapl-mmio:0", "package-0")
    source = rapl_sysfs.open_source({}, roots)
    names = [z.name for z in source.zones()]
    assert names.count("package-0") == 1
    zone = zones_by_name(source)["package-0"]
    assert "intel-rapl:0/" in zone.path  # type: ignore[attr-defined]
    assert any("MMIO duplicate" in note for note in source.notes)


def test_mmio_zone_without_msr_twin_is_used(powercap: PowercapTree, roots: Roots) -> None:
    powercap.add("intel-rapl-mmio:0", "package-0", energy_uj=5_000_000)
    zones = zones_by_name(rapl_sysfs.open_source({}, roots))
    assert list(zones) == ["package-0"]
    assert zones["package-0"].read().value == pytest.approx(5.0)


def test_psys_is_its_own_domain_never_a_package(powercap: PowercapTree, roots: Roots) -> None:
    powercap.add("intel-rapl:0", "package-0")
    powercap.add("intel-rapl:0:0", "core")
    powercap.add("intel-rapl:0:1", "uncore")
    powercap.add("intel-rapl:1", "psys")
    zones = zones_by_name(rapl_sysfs.open_source({}, roots))
    assert zones["psys"].domain == "psys" and zones["psys"].parent is None
    assert zones["uncore-0"].parent == "package-0"


@pytest.mark.parametrize(
    ("entry", "name", "note"),
    [
        ("intel-rapl:3", "package-x", "unknown zone name"),
        ("intel-rapl:0:7", "gpu-bogus", "unknown sub-zone name"),
        ("intel-rapl:9:0", "core", "without a parent"),
    ],
    ids=["a malformed package name", "an unknown sub-zone", "an orphan sub-zone"],
)
def test_odd_zones_are_skipped_and_noted(
    powercap: PowercapTree, roots: Roots, entry: str, name: str, note: str
) -> None:
    powercap.add("intel-rapl:0", "package-0")
    powercap.add(entry, name)
    source = rapl_sysfs.open_source({}, roots)
    assert [z.name for z in source.zones()] == ["package-0"]
    assert any(note in n for n in source.notes)


def test_missing_wrap_range_gives_no_max(powercap: PowercapTree, roots: Roots) -> None:
    powercap.add("intel-rapl:0", "package-0", max_uj=None)
    source = rapl_sysfs.open_source({}, roots)
    assert zones_by_name(source)["package-0"].max_joules is None
    assert any("wrap-arounds" in n for n in source.notes)


def test_no_powercap_tree_is_absent_not_failed(roots: Roots) -> None:
    with pytest.raises(SourceAbsent, match="no powercap tree"):
        rapl_sysfs.open_source({}, roots)


def test_empty_powercap_tree_is_absent(powercap: PowercapTree, roots: Roots) -> None:
    with pytest.raises(SourceAbsent, match="no usable RAPL zone"):
        rapl_sysfs.open_source({}, roots)


def test_permission_denied_names_the_file_and_the_fix(
    powercap: PowercapTree, roots: Roots, monkeypatch: pytest.MonkeyPatch
) -> None:
    zone = powercap.add("intel-rapl:0", "package-0")
    deny(monkeypatch, zone / "energy_uj")
    with pytest.raises(SourceFailed) as err:
        rapl_sysfs.open_source({}, roots)
    message = str(err.value)
    assert str(zone / "energy_uj") in message
    assert "permission denied" in message
    assert "run the agent as root" in message


def test_permission_lost_after_open_fails_the_read_with_the_fix(
    powercap: PowercapTree, roots: Roots, monkeypatch: pytest.MonkeyPatch
) -> None:
    zone_dir = powercap.add("intel-rapl:0", "package-0")
    zone = zones_by_name(rapl_sysfs.open_source({}, roots))["package-0"]
    deny(monkeypatch, zone_dir / "energy_uj")
    with pytest.raises(
        SourceFailed, match=r'rapl zone "package-0" \(.*energy_uj\): permission denied — run the agent as root'
    ):
        zone.read()


def test_garbage_in_energy_uj_is_a_clear_failure(powercap: PowercapTree, roots: Roots) -> None:
    powercap.add("intel-rapl:0", "package-0")
    zone = zones_by_name(rapl_sysfs.open_source({}, roots))["package-0"]
    (powercap.base / "intel-rapl:0" / "energy_uj").write_text("n/a\n")
    with pytest.raises(SourceFailed, match="expected an unsigned integer"):
        zone.read()


def test_hot_plugged_zone_appears_on_the_next_listing(powercap: PowercapTree, roots: Roots) -> None:
    powercap.add("intel-rapl:0", "package-0")
    source = rapl_sysfs.open_source({}, roots)
    assert [z.name for z in source.zones()] == ["package-0"]
    powercap.add("intel-rapl:1", "package-1")
    assert [z.name for z in source.zones()] == ["package-0", "package-1"]
    powercap.remove("intel-rapl:1")
    assert [z.name for z in source.zones()] == ["package-0"]


def test_unknown_options_are_refused(powercap: PowercapTree, roots: Roots) -> None:
    powercap.add("intel-rapl:0", "package-0")
    with pytest.raises(SourceFailed, match="unknown options bogus"):
        rapl_sysfs.open_source({"bogus": 1}, roots)


def test_zone_ids_past_nine_are_hex_as_powercap_writes_them(powercap: PowercapTree, roots: Roots) -> None:
    for s in range(12):  # powercap_sys.c names a zone "%s:%x": the eleventh package is intel-rapl:a
        powercap.add(f"intel-rapl:{s:x}", f"package-{s}")
        powercap.add(f"intel-rapl:{s:x}:0", "dram")
    zones = zones_by_name(rapl_sysfs.open_source({}, roots))
    assert sorted(zones) == sorted([f"package-{s}" for s in range(12)] + [f"dram-{s}" for s in range(12)])


def test_a_package_of_several_dies_is_a_zone_a_die_on_intel(powercap: PowercapTree, roots: Roots) -> None:
    """intel_rapl_common.c names a die's zone package-N-die-M when a package has several (Cascade
    Lake-AP): each die has a counter of its own."""
    Path(roots.procfs).mkdir(parents=True, exist_ok=True)
    (Path(roots.procfs) / "cpuinfo").write_text("processor\t: 0\nvendor_id\t: GenuineIntel\n")
    for s in range(2):
        for d in range(2):
            i = 2 * s + d
            powercap.add(f"intel-rapl:{i:x}", f"package-{s}-die-{d}")
            powercap.add(f"intel-rapl:{i:x}:0", "dram")
    zones = zones_by_name(rapl_sysfs.open_source({}, roots))
    assert sorted(zones) == ["dram-0-die-0", "dram-0-die-1", "dram-1-die-0", "dram-1-die-1",
                             "package-0-die-0", "package-0-die-1", "package-1-die-0", "package-1-die-1"]
    assert zones["package-1-die-1"].domain == "package" and zones["dram-1-die-1"].domain == "dram"


def test_amds_die_zones_of_one_package_count_its_one_counter_once(powercap: PowercapTree, roots: Roots) -> None:
    Path(roots.procfs).mkdir(parents=True, exist_ok=True)
    (Path(roots.procfs) / "cpuinfo").write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n")
    for d in range(4):
        powercap.add(f"intel-rapl:{d:x}", f"package-0-die-{d}", energy_uj=5_000_000)
    source = rapl_sysfs.open_source({}, roots)
    assert sorted(zones_by_name(source)) == ["package-0-die-0"]
    assert any("reads its package's one counter (AuthenticAMD lists a zone a die)" in n for n in source.notes)
