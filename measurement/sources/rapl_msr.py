"""RAPL energy counters read straight from the model-specific registers (``/dev/cpu/N/msr``).

The fallback for kernels without the powercap driver. Opt-in: reading MSRs needs the ``msr``
module, root and CAP_SYS_RAWIO (``deploy/agent/overlays/msr`` grants exactly that).

Registers (offsets into ``/dev/cpu/N/msr``, read with ``pread`` as 8 little-endian bytes; every
energy counter is the low 32 bits and wraps at 2³² units)::

    Intel  0x606  MSR_RAPL_POWER_UNIT     energy status unit = bits 12:8 (1/2^ESU joules)
           0x611  MSR_PKG_ENERGY_STATUS   package-N   (one CPU per package)
           0x619  MSR_DRAM_ENERGY_STATUS  dram-N
           0x639  MSR_PP0_ENERGY_STATUS   core-N      (part of package-N)
           0x64D  MSR_PLATFORM_ENERGY_STATUS  psys    (read once)
    AMD    0xC0010299  RAPL_PWR_UNIT      energy unit = bits 12:8
           0xC001029B  PKG_ENERGY_STAT    package-N
           0xC001029A  CORE_ENERGY_STAT   core-<cpu>  (per physical core, part of package-N)

DRAM unit quirk: on the server parts below the DRAM counter counts in a fixed 2⁻¹⁶ J
(15.3 µJ), whatever 0x606 says (Linux ``RAPL_UNIT_QUIRK_INTEL_HSW``; the Xeon datasheets for
these families, vol. 2)::

    family 6, model 0x3F  Haswell-EP/EX          model 0x4F  Broadwell-EP/EX
              model 0x55  Skylake-SP, Cascade Lake-SP, Cooper Lake-SP
              model 0x6A  Ice Lake-SP            model 0x6C  Ice Lake-D
              model 0x57  Xeon Phi Knights Landing  model 0x85  Xeon Phi Knights Mill

Psys unit quirk: Sapphire Rapids-SP (0x8F) and Emerald Rapids-SP (0xCF) count psys in whole
joules (Linux ``RAPL_UNIT_QUIRK_INTEL_SPR``). The CPU family and model come from
``<procfs>/cpuinfo``; so does the package of each CPU (``physical id``).

With 32-bit counters the wrap period is 2³² × unit ÷ power: about 262 kJ ÷ 200 W ≈ 22 min for
a typical Intel package, but only ~65 kJ on an AMD socket with 2⁻¹⁶ J units (≈ 4 min at
280 W), so the sampler must read every few seconds; it keeps 64-bit totals.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources.base import Reading, ReadingKind, Roots

NAME = "rapl_msr"

INTEL_POWER_UNIT = 0x606
INTEL_PKG_ENERGY = 0x611
INTEL_DRAM_ENERGY = 0x619
INTEL_PP0_ENERGY = 0x639
INTEL_PSYS_ENERGY = 0x64D
AMD_POWER_UNIT = 0xC0010299
AMD_CORE_ENERGY = 0xC001029A
AMD_PKG_ENERGY = 0xC001029B

COUNTER_BITS = 32
DRAM_FIXED_UNIT_J = 2.0**-16  # 15.2587890625 µJ
# (family, model) with the fixed DRAM unit: Haswell-EP .. Ice Lake-SP, and Xeon Phi.
DRAM_FIXED_UNIT_MODELS = frozenset({(6, 0x3F), (6, 0x4F), (6, 0x55), (6, 0x6A), (6, 0x6C), (6, 0x57), (6, 0x85)})
PSYS_JOULE_UNIT_MODELS = frozenset({(6, 0x8F), (6, 0xCF)})  # Sapphire / Emerald Rapids-SP
PERMISSION_FIX = "reading MSRs needs root with CAP_SYS_RAWIO: deploy the msr overlay (deploy/agent/overlays/msr)"

Clock = Callable[[], float]


@dataclass(frozen=True)
class CpuInfo:
    vendor: str  # GenuineIntel | AuthenticAMD | HygonGenuine
    family: int
    model: int
    packages: dict[int, int]  # physical package id -> first logical CPU in it
    cores: dict[tuple[int, int], int] = field(default_factory=dict)  # (package, core id) -> first CPU


def parse_cpuinfo(text: str) -> CpuInfo:
    """Vendor, family, model and topology from the text of ``/proc/cpuinfo``."""
    vendor, family, model = "", -1, -1
    packages: dict[int, int] = {}
    cores: dict[tuple[int, int], int] = {}
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "processor" not in fields or not fields["processor"].isdigit():
            continue
        cpu = int(fields["processor"])
        vendor = vendor or fields.get("vendor_id", "")
        if family < 0 and fields.get("cpu family", "").isdigit():
            family = int(fields["cpu family"])
        if model < 0 and fields.get("model", "").isdigit():
            model = int(fields["model"])
        package = int(fields["physical id"]) if fields.get("physical id", "").isdigit() else 0
        core = int(fields["core id"]) if fields.get("core id", "").isdigit() else cpu
        packages.setdefault(package, cpu)
        cores.setdefault((package, core), cpu)
    return CpuInfo(vendor, family, model, packages, cores)


@dataclass(frozen=True, slots=True)
class MsrZone:
    name: str
    domain: str
    parent: str | None
    unit_joules: float
    fd: int
    offset: int
    path: str
    clock: Clock
    kind: ReadingKind = "counter"

    @property
    def max_joules(self) -> float:
        return float(2**COUNTER_BITS) * self.unit_joules

    def read(self) -> Reading:
        count = read_msr(self.fd, self.offset, self.path, self.name) & ((1 << COUNTER_BITS) - 1)
        return Reading(count * self.unit_joules, self.clock())


_pread = os.pread  # the msr driver reads register N at file offset N (tests emulate it here)


def read_msr(fd: int, offset: int, path: str, what: str) -> int:
    try:
        raw = _pread(fd, 8, offset)
    except OSError as err:
        raise SourceFailed(
            f'rapl_msr zone "{what}" ({path} @ {offset:#x}): read failed: {err.strerror or err} '
            "(register not implemented on this CPU?)"
        ) from err
    if len(raw) != 8:
        raise SourceFailed(f'rapl_msr zone "{what}" ({path} @ {offset:#x}): short read of {len(raw)} bytes')
    return int.from_bytes(raw, "little")


class RaplMsr:
    name = NAME

    def __init__(self, roots: Roots, clock: Clock = time.time) -> None:
        self.roots = roots
        self.clock = clock
        self.notes: list[str] = []
        self._fds: dict[int, int] = {}
        self._zones = self._build()

    def zones(self) -> Sequence[MsrZone]:
        return list(self._zones)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _open(self, cpu: int) -> tuple[int, str]:
        path = str(Path(self.roots.dev) / "cpu" / str(cpu) / "msr")
        if cpu in self._fds:
            return self._fds[cpu], path
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError as err:
            raise SourceAbsent(f"rapl_msr: no {path} — load the msr module (modprobe msr) and mount /dev/cpu") from err
        except PermissionError as err:
            raise SourceFailed(f"rapl_msr ({path}): permission denied — {PERMISSION_FIX}") from err
        except OSError as err:
            raise SourceFailed(f"rapl_msr ({path}): cannot open: {err.strerror or err}") from err
        self._fds[cpu] = fd
        return fd, path

    def _build(self) -> list[MsrZone]:
        cpuinfo_path = Path(self.roots.procfs) / "cpuinfo"
        try:
            info = parse_cpuinfo(cpuinfo_path.read_text(encoding="utf-8", errors="replace"))
        except OSError as err:
            raise SourceAbsent(f"rapl_msr: cannot read {cpuinfo_path}: {err.strerror or err}") from err
        if not info.packages:
            raise SourceAbsent(f"rapl_msr: no processor listed in {cpuinfo_path}")
        try:
            if info.vendor == "GenuineIntel":
                return self._intel(info)
            if info.vendor in ("AuthenticAMD", "HygonGenuine") and info.family >= 0x17:
                return self._amd(info)
        except BaseException:
            self.close()
            raise
        raise SourceAbsent(
            f"rapl_msr: no RAPL MSRs known for {info.vendor or 'unknown vendor'} family {info.family:#x}"
        )

    def _unit(self, fd: int, path: str, offset: int) -> float:
        raw = read_msr(fd, offset, path, "energy unit")
        return 0.5 ** ((raw >> 8) & 0x1F)

    def _zone(self, name: str, domain: str, parent: str | None, unit: float, cpu: int, offset: int) -> MsrZone | None:
        fd, path = self._open(cpu)
        zone = MsrZone(name, domain, parent, unit, fd, offset, path, self.clock)
        try:
            zone.read()
        except SourceFailed as err:
            if domain == "package":
                raise
            self.notes.append(f"{err}; zone skipped")
            return None
        return zone

    def _intel(self, info: CpuInfo) -> list[MsrZone]:
        zones: list[MsrZone | None] = []
        fixed_dram = (info.family, info.model) in DRAM_FIXED_UNIT_MODELS
        for package, cpu in sorted(info.packages.items()):
            fd, path = self._open(cpu)
            unit = self._unit(fd, path, INTEL_POWER_UNIT)
            pkg = f"package-{package}"
            zones.append(self._zone(pkg, "package", None, unit, cpu, INTEL_PKG_ENERGY))
            zones.append(self._zone(f"core-{package}", "core", pkg, unit, cpu, INTEL_PP0_ENERGY))
            dram_unit = DRAM_FIXED_UNIT_J if fixed_dram else unit
            zones.append(self._zone(f"dram-{package}", "dram", None, dram_unit, cpu, INTEL_DRAM_ENERGY))
            if package == min(info.packages):
                psys_unit = 1.0 if (info.family, info.model) in PSYS_JOULE_UNIT_MODELS else unit
                zones.append(self._zone("psys", "psys", None, psys_unit, cpu, INTEL_PSYS_ENERGY))
        return [z for z in zones if z is not None]

    def _amd(self, info: CpuInfo) -> list[MsrZone]:
        zones: list[MsrZone | None] = []
        for package, cpu in sorted(info.packages.items()):
            fd, path = self._open(cpu)
            unit = self._unit(fd, path, AMD_POWER_UNIT)
            pkg = f"package-{package}"
            zones.append(self._zone(pkg, "package", None, unit, cpu, AMD_PKG_ENERGY))
            for (core_package, _core), core_cpu in sorted(info.cores.items()):
                if core_package == package:
                    zones.append(self._zone(f"core-{core_cpu}", "core", pkg, unit, core_cpu, AMD_CORE_ENERGY))
        return [z for z in zones if z is not None]


def open_source(options: dict[str, object], roots: Roots, clock: Clock = time.time) -> RaplMsr:
    """Open the source; SourceAbsent without the interface, SourceFailed without permission.

    ``clock`` stamps each reading (the registry passes the sampler's clock)."""
    if options:
        raise SourceFailed(f"rapl_msr: unknown options {', '.join(sorted(options))} (rapl_msr takes none)")
    return RaplMsr(roots, clock)


__all__ = ["NAME", "CpuInfo", "MsrZone", "RaplMsr", "open_source", "parse_cpuinfo"]
