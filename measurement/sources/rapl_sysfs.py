"""RAPL energy counters through the kernel's powercap tree (``/sys/class/powercap``).

The tree, as ``intel_rapl_common`` builds it on Intel and (since Linux 5.8) on AMD Zen::

    /sys/class/powercap/
        intel-rapl/                   control type (enabled), not a zone
        intel-rapl:0/                 name "package-0"; energy_uj, max_energy_range_uj
        intel-rapl:0:0/               name "core"     (PP0: part of package-0)
        intel-rapl:0:1/               name "uncore"   (PP1 / graphics: part of package-0)
        intel-rapl:0:2/               name "dram"     (a separate power plane, see below)
        intel-rapl:1/                 name "package-1" (second socket) or "psys" (platform)
        intel-rapl-mmio:0/            name "package-0" again: the same counter read through MMIO

Rules this module applies:

* ``core`` and ``uncore`` are *part of* their package: they carry ``parent="package-N"`` and the
  sampler never adds them on top of it.
* ``dram`` sits under the package directory but is a separate plane (the package domain
  excludes DRAM, Intel SDM vol. 3B §15.10): it carries no parent and is added to the package.
* ``psys`` (whole SoC platform on client parts) is its own domain: it is never added on top of
  the packages; the sampler uses it instead of package + DRAM when present.
* A zone's ``constraint_X_max_power_uw`` (where the kernel states one) is its ``max_watts``:
  the power gauge never shows more.
* ``intel-rapl-mmio:*`` duplicates of a zone already read through ``intel-rapl:*`` are skipped,
  so that nothing is counted twice; an MMIO zone with no MSR twin is used.
* Unknown or malformed zone names are skipped and listed in :attr:`RaplSysfs.notes`.

Zone names are unique within the source: ``package-0``, ``core-0``, ``uncore-0``, ``dram-0``,
``psys``; the index of a sub-zone is its package's index.

``energy_uj`` has been readable by root only since Linux 5.10 (PLATYPUS, CVE-2020-8694): a
permission error raises :class:`~measurement.errors.SourceFailed` naming the file and the fix.
Raw µJ integers stay inside this module; readings are joules.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources.base import Reading, ReadingKind, Roots

NAME = "rapl_sysfs"
# powercap names a zone "<control type>:<id>" with the id in hex (powercap_sys.c: "%s:%x"), so
# the eleventh package is intel-rapl:a; a socket of several dies has a zone per die,
# package-N-die-M (intel_rapl_common.c, when the topology has more than one die a package).
_ENTRY = re.compile(r"^(intel-rapl|intel-rapl-mmio):([0-9a-f]+)(?::([0-9a-f]+))?$")
_PACKAGE = re.compile(r"^package-(\d+)(?:-die-(\d+))?$")
# AMD and Hygon kernels that list a zone per die give every die the package's one counter: one
# of them is the package (the others would count it again)
_ONE_COUNTER_A_PACKAGE = ("AuthenticAMD", "HygonGenuine")
_SUBZONES = {"core": "core", "uncore": "uncore", "dram": "dram"}
PERMISSION_FIX = "run the agent as root or mount the powercap tree read-only into a root container"

Clock = Callable[[], float]


def read_uint(path: str, what: str) -> int:
    """Read one unsigned integer from a sysfs file; raise SourceFailed naming the path and the fix."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except PermissionError as err:
        raise SourceFailed(f"{what} ({path}): permission denied — {PERMISSION_FIX}") from err
    except FileNotFoundError as err:
        raise SourceFailed(f"{what} ({path}): vanished (zone unplugged or driver unloaded)") from err
    except OSError as err:
        raise SourceFailed(f"{what} ({path}): cannot open: {err.strerror or err}") from err
    try:
        raw = os.read(fd, 64)
    except OSError as err:
        raise SourceFailed(f"{what} ({path}): read failed: {err.strerror or err}") from err
    finally:
        os.close(fd)
    text = raw.strip()
    if not text.isdigit():
        raise SourceFailed(f"{what} ({path}): expected an unsigned integer, got {raw[:32]!r}")
    return int(text)


@dataclass(frozen=True, slots=True)
class SysfsZone:
    """One powercap zone: an energy counter in µJ that wraps at ``max_energy_range_uj``."""

    name: str
    domain: str
    max_joules: float | None
    parent: str | None
    path: str  # the zone's energy_uj file
    clock: Clock
    kind: ReadingKind = "counter"
    max_watts: float | None = None  # the highest constraint_*_max_power_uw the kernel states

    def read(self) -> Reading:
        energy_uj = read_uint(self.path, f'rapl zone "{self.name}"')
        return Reading(energy_uj / 1e6, self.clock())


@dataclass(frozen=True)
class _Entry:
    directory: str  # intel-rapl:0:1
    mmio: bool
    index: int
    sub: int | None
    raw_name: str


class RaplSysfs:
    """The powercap RAPL zones under ``<sysfs>/class/powercap``."""

    name = NAME

    def __init__(self, sysfs_root: str, clock: Clock = time.time, vendor: str = "") -> None:
        self.base = Path(sysfs_root) / "class" / "powercap"
        self.clock = clock
        self.vendor = vendor  # /proc/cpuinfo's vendor_id (AMD's die zones share one counter)
        self.notes: list[str] = []  # zones skipped and why (logged by the agent)
        self._zones: list[SysfsZone] = []

    def zones(self) -> Sequence[SysfsZone]:
        """Re-list the tree (zones can be hot-plugged) and probe each counter once."""
        self._zones = self._scan()
        return list(self._zones)

    def _scan(self) -> list[SysfsZone]:
        if not self.base.is_dir():
            raise SourceAbsent(
                f"rapl_sysfs: no powercap tree at {self.base} (kernel without intel_rapl, or not mounted)"
            )
        notes: list[str] = []
        entries: list[_Entry] = []
        for directory in sorted(os.listdir(self.base)):
            match = _ENTRY.match(directory)
            if not match:
                continue
            name_file = self.base / directory / "name"
            try:
                raw_name = name_file.read_text(encoding="utf-8", errors="replace").strip()
            except OSError as err:
                notes.append(f"{name_file}: unreadable ({err.strerror or err}); zone skipped")
                continue
            entries.append(
                _Entry(
                    directory,
                    match.group(1) == "intel-rapl-mmio",
                    int(match.group(2), 16),
                    int(match.group(3), 16) if match.group(3) is not None else None,
                    raw_name,
                )
            )
        # MSR-backed zones first so that an MMIO twin with the same name is the one skipped.
        entries.sort(key=lambda e: (e.mmio, e.index, -1 if e.sub is None else e.sub))
        top_names: dict[tuple[bool, int], str] = {}
        zones: dict[str, SysfsZone] = {}
        denied: list[str] = []
        for entry in entries:
            zone_name, domain, parent = self._classify(entry, top_names, notes)
            if zone_name is None:
                continue
            if zone_name in zones:
                what = "MMIO duplicate of" if entry.mmio else "second zone named"
                notes.append(f"{self.base / entry.directory}: {what} {zone_name!r}; skipped (never counted twice)")
                continue
            zone_dir = self.base / entry.directory
            max_joules = self._max_joules(zone_dir, zone_name, notes)
            zone = SysfsZone(
                zone_name,
                domain,
                max_joules,
                parent,
                str(zone_dir / "energy_uj"),
                self.clock,
                max_watts=self._max_watts(zone_dir),
            )
            try:
                zone.read()
            except SourceFailed as err:
                if "permission denied" in str(err):
                    denied.append(zone.path)
                    continue
                notes.append(f"{err}; zone skipped")
                continue
            zones[zone_name] = zone
        self.notes = notes
        if denied:
            more = f" (and {len(denied) - 1} more zone{'s' if len(denied) > 2 else ''})" if len(denied) > 1 else ""
            raise SourceFailed(f"rapl_sysfs ({denied[0]}){more}: permission denied — {PERMISSION_FIX}")
        if not zones:
            detail = "; ".join(notes) if notes else "no intel-rapl zones"
            raise SourceAbsent(f"rapl_sysfs: no usable RAPL zone under {self.base} ({detail})")
        return list(zones.values())

    def _classify(
        self, entry: _Entry, top_names: dict[tuple[bool, int], str], notes: list[str]
    ) -> tuple[str | None, str, str | None]:
        raw = entry.raw_name
        where = self.base / entry.directory
        if entry.sub is None:
            package = _PACKAGE.match(raw)
            if package:
                if package.group(2) not in (None, "0") and self.vendor in _ONE_COUNTER_A_PACKAGE:
                    notes.append(
                        f"{where}: {raw!r} reads its package's one counter ({self.vendor} lists a zone a die); "
                        "counted once, as die 0"
                    )
                    return None, "", None
                top_names[(entry.mmio, entry.index)] = raw
                return raw, "package", None
            if raw == "psys":
                name = "psys" if entry.index <= 1 else f"psys-{entry.index}"
                top_names[(entry.mmio, entry.index)] = name
                return name, "psys", None
            if raw == "dram":  # a top-level DRAM zone (seen on some server BIOSes)
                top_names[(entry.mmio, entry.index)] = f"dram-{entry.index}"
                return f"dram-{entry.index}", "dram", None
            notes.append(f"{where}: unknown zone name {raw!r}; skipped")
            return None, "", None
        parent = top_names.get((entry.mmio, entry.index))
        if parent is None:
            notes.append(f"{where}: sub-zone {raw!r} without a parent zone; skipped")
            return None, "", None
        if raw not in _SUBZONES:
            notes.append(f"{where}: unknown sub-zone name {raw!r}; skipped")
            return None, "", None
        match = _PACKAGE.match(parent)
        package_index = parent.removeprefix("package-") if match else str(entry.index)  # 0, or 0-die-1
        name = f"{raw}-{package_index}"
        # DRAM is a separate plane (not part of the package); core and uncore are part of it.
        return name, _SUBZONES[raw], None if raw == "dram" else parent

    @staticmethod
    def _max_watts(zone_dir: Path) -> float | None:
        """The zone's stated maximum power (``constraint_X_max_power_uw``, optional in the powercap
        ABI) of its short-term or peak constraint (PL2, PL4: the package's MAX_POWER); None when
        none is stated. The long-term constraint's (PL1) is the thermal design power, which a
        package exceeds in turbo for as long as PL2 allows: no cap."""
        highest = 0
        for path in zone_dir.glob("constraint_*_max_power_uw"):
            name_file = path.with_name(path.name.replace("_max_power_uw", "_name"))
            try:
                if name_file.read_text(encoding="utf-8", errors="replace").strip() not in ("short_term", "peak_power"):
                    continue
                highest = max(highest, read_uint(str(path), "max power"))
            except (OSError, SourceFailed):
                continue
        return highest / 1e6 if highest > 0 else None

    @staticmethod
    def _max_joules(zone_dir: Path, zone_name: str, notes: list[str]) -> float | None:
        path = str(zone_dir / "max_energy_range_uj")
        try:
            value = read_uint(path, f'rapl zone "{zone_name}" wrap range')
        except SourceFailed as err:
            notes.append(f"{err}; wrap-arounds of this zone will be dropped as anomalies")
            return None
        return value / 1e6 if value > 0 else None


def open_source(options: dict[str, object], roots: Roots, clock: Clock = time.time) -> RaplSysfs:
    """Open the source; SourceAbsent without the interface, SourceFailed without permission.

    ``clock`` stamps each reading (the registry passes the sampler's clock)."""
    if options:
        raise SourceFailed(f"rapl_sysfs: unknown options {', '.join(sorted(options))} (rapl_sysfs takes none)")
    source = RaplSysfs(roots.sysfs, clock, cpu_vendor(roots.procfs))
    source.zones()
    return source


def cpu_vendor(procfs_root: str) -> str:
    """The first ``vendor_id`` of ``<procfs>/cpuinfo`` ("" when it cannot be read)."""
    try:
        with open(os.path.join(procfs_root, "cpuinfo"), encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    return value.strip()
    except OSError:
        pass
    return ""


__all__ = ["NAME", "PERMISSION_FIX", "RaplSysfs", "SysfsZone", "open_source", "read_uint"]
