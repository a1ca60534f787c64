"""What the host is made of, for the registration: CPUs, sockets, memory, disks, GPUs.

Read from the trees the agent already takes as roots, so that tests point it at replicas:

* sockets and physical cores: ``<sysfs>/devices/system/cpu/cpu*/topology/{physical_package_id,core_id}``
  (every architecture), else ``physical id``/``core id`` in ``<procfs>/cpuinfo``;
* CPU vendor and type: ``vendor_id`` and ``model name`` in ``<procfs>/cpuinfo`` (GenuineIntel →
  Intel, AuthenticAMD → AMD; on Arm, ``CPU implementer``);
* installed memory: the memory blocks of ``<sysfs>/devices/system/memory`` × ``block_size_bytes``
  (what the firmware handed the kernel: close to the DIMMs' total), else ``MemTotal`` of
  ``<procfs>/meminfo`` rounded up to a GB (an underestimate: the kernel keeps some for itself);
* disks: ``<sysfs>/block/*`` (not loop, ram, zram, dm, md, optical or removable devices): NVMe by
  name, HDD when ``queue/rotational`` is 1, else SSD; capacity from ``size`` (512-byte sectors);
  vendor from the device's ``vendor`` file, or the first word of its ``model``;
* GPUs: the models the NVML source reported (the caller passes them; nothing here opens NVML).

Everything the configuration sets wins over what is found here; what cannot be found is left
out of the registration (the spec makes it optional) and named in the notes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from joulesched.measurement.nadiki.model import Processor, ServerDescription, StorageDevice
from joulesched.measurement.sources.base import Roots

CPU_VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD", "HygonGenuine": "Hygon", "CentaurHauls": "Centaur"}
ARM_IMPLEMENTERS = {
    "0x41": "Arm",
    "0x46": "Fujitsu",
    "0x48": "HiSilicon",
    "0x4e": "NVIDIA",
    "0x50": "Ampere",
    "0x51": "Qualcomm",
    "0x61": "Apple",
    "0xc0": "Ampere",
}
SKIP_BLOCK = re.compile(r"^(loop|ram|zram|dm-|md|sr|fd|nbd|rbd|mmcblk\d+boot)")


@dataclass(frozen=True)
class HostFacts:
    cpus: tuple[Processor, ...] = ()
    sockets: int | None = None
    memory_gb: int | None = None
    storage: tuple[StorageDevice, ...] = ()
    gpus: tuple[Processor, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _cpuinfo_blocks(procfs: Path) -> list[dict[str, str]]:
    text = _read(procfs / "cpuinfo") or ""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, _, value = line.partition(":")
        current.setdefault(key.strip(), value.strip())
    if current:
        blocks.append(current)
    return blocks


def _topology(sysfs: Path, blocks: list[dict[str, str]]) -> dict[int, set[int]]:
    """socket -> core ids."""
    sockets: dict[int, set[int]] = {}
    cpu_dir = sysfs / "devices" / "system" / "cpu"
    for topo in sorted(cpu_dir.glob("cpu[0-9]*/topology")):
        package, core = _read(topo / "physical_package_id"), _read(topo / "core_id")
        if package is None or core is None or not package.lstrip("-").isdigit() or not core.isdigit():
            continue
        sockets.setdefault(max(int(package), 0), set()).add(int(core))
    if sockets:
        return sockets
    for block in blocks:
        package, core = block.get("physical id"), block.get("core id")
        if package and core and package.isdigit() and core.isdigit():
            sockets.setdefault(int(package), set()).add(int(core))
    return sockets


def discover_cpus(roots: Roots, notes: list[str]) -> tuple[tuple[Processor, ...], int | None]:
    blocks = _cpuinfo_blocks(Path(roots.procfs))
    sockets = _topology(Path(roots.sysfs), blocks)
    first = blocks[0] if blocks else {}
    vendor = CPU_VENDORS.get(first.get("vendor_id", ""), first.get("vendor_id", ""))
    if not vendor and first.get("CPU implementer"):
        vendor = ARM_IMPLEMENTERS.get(first["CPU implementer"].lower(), first["CPU implementer"])
    model = first.get("model name") or first.get("Model") or first.get("cpu model") or ""
    if not blocks:
        notes.append(f"{roots.procfs}/cpuinfo unreadable: installed_cpus left out")
        return (), len(sockets) or None
    if not vendor or not model:
        notes.append(
            f"{roots.procfs}/cpuinfo names no CPU vendor or model: installed_cpus left out "
            "(set nadiki.server.installed_cpus)"
        )
        return (), len(sockets) or None
    if not sockets:
        notes.append("no CPU topology found: physical_core_count and total_cpu_sockets left out")
        return (Processor(vendor, model),), None
    cpus = tuple(Processor(vendor, model, len(cores)) for _, cores in sorted(sockets.items()))
    return cpus, len(sockets)


def discover_memory_gb(roots: Roots, notes: list[str]) -> int | None:
    memory = Path(roots.sysfs) / "devices" / "system" / "memory"
    block_size = _read(memory / "block_size_bytes")
    blocks = list(memory.glob("memory[0-9]*"))
    if block_size and blocks:
        try:
            total = int(block_size, 16) * len(blocks)
            return round(total / 2**30)
        except ValueError:
            pass
    meminfo = _read(Path(roots.procfs) / "meminfo") or ""
    match = re.search(r"^MemTotal:\s+(\d+)\s+kB", meminfo, re.MULTILINE)
    if match:
        notes.append(
            "installed memory estimated from MemTotal (an underestimate): set "
            "nadiki.server.total_installed_memory for the exact figure"
        )
        return -(-int(match.group(1)) // 2**20)  # kB -> GB, rounded up
    notes.append("installed memory unknown: total_installed_memory left out")
    return None


def discover_storage(roots: Roots, notes: list[str]) -> tuple[StorageDevice, ...]:
    base = Path(roots.sysfs) / "block"
    devices: list[StorageDevice] = []
    for dev in sorted(base.glob("*")) if base.is_dir() else []:
        name = dev.name
        if SKIP_BLOCK.match(name) or _read(dev / "removable") == "1":
            continue
        size = _read(dev / "size")
        if not size or not size.isdigit() or int(size) == 0:
            continue
        if name.startswith("nvme"):
            kind = "NVMe"
        elif _read(dev / "queue" / "rotational") == "1":
            kind = "HDD"
        else:
            kind = "SSD"
        model = _read(dev / "device" / "model") or ""
        vendor = _read(dev / "device" / "vendor") or ""
        if not vendor or vendor.upper() == "ATA" or vendor.startswith("0x"):
            vendor = model.split()[0] if model else ""
        if not vendor:
            notes.append(f"{dev}: vendor unknown; reported as 'unknown'")
            vendor = "unknown"
        devices.append(StorageDevice(vendor, round(int(size) * 512 / 1e12, 3), kind))
    return tuple(devices)


def discover(roots: Roots, gpu_models: Sequence[str] = ()) -> HostFacts:
    notes: list[str] = []
    cpus, sockets = discover_cpus(roots, notes)
    gpus = tuple(Processor("NVIDIA", model) for model in gpu_models)
    return HostFacts(
        cpus, sockets, discover_memory_gb(roots, notes), discover_storage(roots, notes), gpus, tuple(notes)
    )


def complete(description: ServerDescription, facts: HostFacts) -> ServerDescription:
    """Fill what the configuration left unset with what was found."""
    changes: dict[str, object] = {}
    if not description.installed_cpus and facts.cpus:
        changes["installed_cpus"] = facts.cpus
    if description.total_cpu_sockets is None and facts.sockets:
        changes["total_cpu_sockets"] = facts.sockets
    if description.total_installed_memory is None and facts.memory_gb:
        changes["total_installed_memory"] = facts.memory_gb
    if not description.storage_devices and facts.storage:
        changes["storage_devices"] = facts.storage
    if not description.installed_gpus and facts.gpus:
        changes["installed_gpus"] = facts.gpus
    return replace(description, **changes) if changes else description  # type: ignore[arg-type]


__all__ = ["HostFacts", "complete", "discover", "discover_cpus", "discover_memory_gb", "discover_storage"]
