"""RAPL through MSRs, against sparse files standing in for /dev/cpu/N/msr."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources import rapl_msr as m
from joulesched.measurement.sources.base import Roots
from tests.measurement.replica import MsrEmulator, ProcTree, write_msr

ESU_14 = 0xA0E03  # a typical Intel 0x606: power 1/8 W, energy 1/2^14 J (bits 12:8 = 0x0E), time 1/2^10 s
ESU_16 = 0xA1003  # energy unit bits 12:8 = 0x10 -> 1/2^16 J (AMD Zen)


def intel(proc: ProcTree, dev: Path, model: int, *, packages: int = 1, psys: bool = True, pkg: int = 1000) -> None:
    proc.set_cpuinfo("GenuineIntel", 6, model, packages=packages, cores_per_package=2, threads=2)
    for package in range(packages):
        cpu = package * 4
        values = {
            m.INTEL_POWER_UNIT: ESU_14,
            m.INTEL_PKG_ENERGY: pkg + package,
            m.INTEL_DRAM_ENERGY: 500,
            m.INTEL_PP0_ENERGY: 700,
        }
        if psys:
            values[m.INTEL_PSYS_ENERGY] = 3000
        write_msr(dev, cpu, values)


def zones(roots: Roots) -> dict[str, m.MsrZone]:
    source = m.open_source({}, roots, clock=lambda: 7.0)
    return {z.name: z for z in source.zones()}


@pytest.mark.parametrize(
    ("model", "dram_unit"),
    [
        (0x3F, 2.0**-16),  # Haswell-EP
        (0x4F, 2.0**-16),  # Broadwell-EP
        (0x55, 2.0**-16),  # Skylake-SP / Cascade Lake-SP
        (0x6A, 2.0**-16),  # Ice Lake-SP
        (0x8C, 2.0**-14),  # Tiger Lake (client): DRAM follows 0x606
        (0x8F, 2.0**-14),  # Sapphire Rapids-SP: DRAM follows 0x606 again
    ],
    ids=["haswell-ep", "broadwell-ep", "skylake-sp", "icelake-sp", "tigerlake-client", "sapphirerapids-sp"],
)
def test_dram_unit_is_fixed_on_haswell_ep_to_icelake_sp_only(
    proc: ProcTree, roots: Roots, model: int, dram_unit: float
) -> None:
    intel(proc, Path(roots.dev), model)
    z = zones(roots)
    assert z["package-0"].unit_joules == 2.0**-14
    assert z["dram-0"].unit_joules == dram_unit
    assert z["dram-0"].read().value == pytest.approx(500 * dram_unit)


def test_intel_zones_units_and_wrap_range(proc: ProcTree, roots: Roots) -> None:
    intel(proc, Path(roots.dev), 0x55, packages=2)
    z = zones(roots)
    assert sorted(z) == ["core-0", "core-1", "dram-0", "dram-1", "package-0", "package-1", "psys"]
    assert z["core-1"].parent == "package-1"
    assert z["package-1"].read().value == pytest.approx(1001 * 2.0**-14)
    assert z["package-0"].read().timestamp == 7.0
    assert z["package-0"].max_joules == pytest.approx(2**32 * 2.0**-14)  # 262144 J


def test_psys_counts_whole_joules_on_sapphire_rapids(proc: ProcTree, roots: Roots) -> None:
    intel(proc, Path(roots.dev), 0x8F)
    assert zones(roots)["psys"].read().value == pytest.approx(3000.0)


def test_only_the_low_32_bits_count(proc: ProcTree, roots: Roots) -> None:
    intel(proc, Path(roots.dev), 0x55, pkg=(0xDEAD << 32) | 5)
    assert zones(roots)["package-0"].read().value == pytest.approx(5 * 2.0**-14)


def test_unimplemented_register_skips_that_zone_only(proc: ProcTree, roots: Roots) -> None:
    proc.set_cpuinfo("GenuineIntel", 6, 0x55)
    # the file ends before 0x619: reading DRAM, PP0 and psys comes back short, as EIO would
    write_msr(Path(roots.dev), 0, {m.INTEL_POWER_UNIT: ESU_14, m.INTEL_PKG_ENERGY: 10})
    os.truncate(Path(roots.dev) / "cpu" / "0" / "msr", m.INTEL_PKG_ENERGY + 8)
    source = m.open_source({}, roots)
    assert [z.name for z in source.zones()] == ["package-0"]
    assert any("dram-0" in note for note in source.notes)


def test_amd_zen_package_and_per_core_zones(proc: ProcTree, roots: Roots, monkeypatch: pytest.MonkeyPatch) -> None:
    proc.set_cpuinfo("AuthenticAMD", 0x19, 0x01, packages=1, cores_per_package=2, threads=2)
    device = MsrEmulator(Path(roots.dev))  # adjacent registers: a sparse file cannot hold them
    for cpu in range(4):
        device.set(cpu, {m.AMD_POWER_UNIT: ESU_16, m.AMD_PKG_ENERGY: 65536, m.AMD_CORE_ENERGY: 100 + cpu})
    monkeypatch.setattr(m, "_pread", device.pread)
    z = zones(roots)
    assert sorted(z) == ["core-0", "core-2", "package-0"]  # one zone per physical core (first thread)
    assert z["package-0"].read().value == pytest.approx(1.0)
    assert z["core-2"].read().value == pytest.approx(102 * 2.0**-16)
    assert z["core-2"].parent == "package-0"
    assert z["package-0"].max_joules == pytest.approx(65536.0)


def test_eio_from_the_driver_skips_an_optional_zone(
    proc: ProcTree, roots: Roots, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc.set_cpuinfo("GenuineIntel", 6, 0x8C)
    device = MsrEmulator(Path(roots.dev))
    device.set(0, {m.INTEL_POWER_UNIT: ESU_14, m.INTEL_PKG_ENERGY: 1, m.INTEL_PP0_ENERGY: 2})
    monkeypatch.setattr(m, "_pread", device.pread)
    source = m.open_source({}, roots)
    assert sorted(z.name for z in source.zones()) == ["core-0", "package-0"]
    assert any("Input/output error" in note for note in source.notes)


def test_no_msr_device_is_absent_with_the_fix(proc: ProcTree, roots: Roots) -> None:
    proc.set_cpuinfo("GenuineIntel", 6, 0x55)
    with pytest.raises(SourceAbsent, match="modprobe msr"):
        m.open_source({}, roots)


def test_permission_denied_names_the_capability(proc: ProcTree, roots: Roots, monkeypatch: pytest.MonkeyPatch) -> None:
    intel(proc, Path(roots.dev), 0x55)
    real_open = os.open

    def denied(path: str, flags: int, *args: int) -> int:
        if str(path).endswith("/msr"):
            raise PermissionError(errno.EPERM, "Operation not permitted", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(SourceFailed, match="CAP_SYS_RAWIO"):
        m.open_source({}, roots)


def test_unknown_vendor_is_absent(proc: ProcTree, roots: Roots) -> None:
    proc.set_cpuinfo("CentaurHauls", 6, 0x0F)
    with pytest.raises(SourceAbsent, match="no RAPL MSRs known"):
        m.open_source({}, roots)


def test_cpuinfo_parsing_finds_packages_and_cores() -> None:
    text = "\n\n".join(
        f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\nphysical id\t: {cpu // 4}\ncore id\t\t: {cpu % 2}"
        for cpu in range(8)
    )
    info = m.parse_cpuinfo(text)
    assert (info.vendor, info.family, info.model) == ("GenuineIntel", 6, 0x55)
    assert info.packages == {0: 0, 1: 4}
    assert info.cores == {(0, 0): 0, (0, 1): 1, (1, 0): 4, (1, 1): 5}
