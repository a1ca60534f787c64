"""NVIDIA GPUs through NVML (the ``pynvml`` module of the nvidia-ml-py distribution).

Per GPU, one zone ``gpu-<index>`` (domain ``gpu``):

* ``counter``: ``nvmlDeviceGetTotalEnergyConsumption`` — millijoules since the driver was
  loaded, a 64-bit count (Volta and newer): exported in joules, never wraps (a driver reload
  restarts it; the sampler sees that as a negative delta, an anomaly);
* ``power`` where the counter is not supported: ``nvmlDeviceGetPowerUsage`` (milliwatts →
  watts), which the sampler integrates.

Each zone also carries what the extender's profile needs: ``model``, ``uuid``,
``power_limit_watts`` (``nvmlDeviceGetEnforcedPowerLimit``: the limit in force now) and
``power_management_limit_watts`` (``nvmlDeviceGetPowerManagementLimit``: the one set by the
administrator).

MIG: NVML meters the whole physical GPU, never a MIG instance. A GPU in MIG mode keeps its
whole-GPU zone with ``mig=True`` and a note saying that its energy is not split between
instances; per-process use is not reported for it (NVML does not support it in MIG mode).

:meth:`Nvml.process_utilisation` returns ``{pid: {"gpu-0": fraction}}`` from
``nvmlDeviceGetProcessUtilization`` samples newer than the previous call (SM utilisation,
summed per process over the samples and divided by the number of sampling instants seen on that
GPU, so that a process sampled in ten instants weighs ten times one sampled once). The agent maps
pids to pods through ``/proc/<pid>/cgroup``.

Absent when the module, the library (``libnvidia-ml.so.1``), the driver or any GPU is missing.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources.base import Reading, ReadingKind, Roots

NAME = "nvml"
OPTIONS = frozenset({"clock", "devices"})

Clock = Callable[[], float]


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _error_name(nvml: ModuleType, err: BaseException) -> str:
    return f"{type(err).__name__} ({err})" if isinstance(err, nvml.NVMLError) else repr(err)


_FIXES = {
    "NVMLError_GpuIsLost": "the GPU fell off the bus — check dmesg (Xid errors) and nvidia-smi; the GPU needs a reset",
    "NVMLError_NoPermission": "run the agent as root or give it access to /dev/nvidia*",
    "NVMLError_Uninitialized": "NVML was shut down under the agent — restart the agent",
    "NVMLError_DriverNotLoaded": "load the NVIDIA kernel driver (nvidia-smi must work)",
    "NVMLError_LibRmVersionMismatch": "the NVML library and the kernel driver differ — reboot after a driver upgrade",
}


@dataclass(frozen=True, slots=True)
class NvmlZone:
    """One physical GPU."""

    name: str  # gpu-<index>
    kind: ReadingKind  # counter (energy since driver load) or power
    index: int
    uuid: str
    model: str
    power_limit_watts: float | None
    power_management_limit_watts: float | None
    mig: bool | None  # None: the GPU has no MIG (before Ampere)
    read_value: Callable[[], float] = field(repr=False)
    clock: Clock = field(repr=False)
    domain: str = "gpu"
    max_joules: float | None = None
    parent: str | None = None

    def read(self) -> Reading:
        value = self.read_value()
        return Reading(value, self.clock())


class Nvml:
    """Every NVIDIA GPU of the host, through one NVML session."""

    name = NAME

    def __init__(self, nvml: ModuleType, clock: Clock) -> None:
        self.nvml = nvml
        self.clock = clock
        self.notes: list[str] = []
        self.driver_version: str | None = None
        self._zones: list[NvmlZone] = []
        self._handles: dict[str, Any] = {}
        self._last_seen: dict[str, int] = {}  # zone -> newest process sample timestamp (µs)
        self._no_process_util: set[str] = set()
        self._lock = threading.Lock()
        self._open = True

    def zones(self) -> Sequence[NvmlZone]:
        return list(self._zones)

    def describe(self) -> dict[str, str]:
        gpus = ", ".join(f"{z.name}={z.model}{' (MIG)' if z.mig else ''}" for z in self._zones)
        return {"driver": self.driver_version or "?", "gpus": gpus}

    # -- discovery --
    def discover(self, wanted: Sequence[str] | None) -> None:
        nvml = self.nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as err:
            raise SourceFailed(f"{NAME}: nvmlDeviceGetCount failed: {_error_name(nvml, err)}") from err
        if count == 0:
            raise SourceAbsent(f"{NAME}: the NVIDIA driver is loaded but reports no GPU")
        try:
            self.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            self.driver_version = None
        zones: list[NvmlZone] = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                model = _text(nvml.nvmlDeviceGetName(handle))
            except nvml.NVMLError as err:
                self.notes.append(f"{NAME}: gpu-{index}: skipped, cannot open it: {_error_name(nvml, err)}")
                continue
            name = f"gpu-{index}"
            if wanted and not ({str(index), uuid, name} & set(wanted)):
                continue
            zone = self._zone(index, name, handle, uuid, model)
            if zone is not None:
                zones.append(zone)
                self._handles[name] = handle
        if wanted:
            found = {z.name for z in zones} | {z.uuid for z in zones} | {str(z.index) for z in zones}
            missing = [w for w in wanted if w not in found]
            if missing:
                raise SourceFailed(
                    f"{NAME}: devices {', '.join(missing)} (option devices) not found among the {count} GPUs; "
                    "name them by index, gpu-<index> or UUID (nvidia-smi -L)"
                )
        if not zones:
            detail = "; ".join(self.notes) or "no GPU meters power"
            raise SourceAbsent(f"{NAME}: no GPU with a power or energy reading ({detail})")
        self._zones = zones

    def _zone(self, index: int, name: str, handle: Any, uuid: str, model: str) -> NvmlZone | None:
        nvml = self.nvml
        where = f"{NAME} {name} ({model}, {uuid})"
        kind: ReadingKind
        try:
            nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            kind = "counter"
        except nvml.NVMLError_NotSupported:
            try:
                nvml.nvmlDeviceGetPowerUsage(handle)
                kind = "power"
                self.notes.append(f"{where}: no energy counter (before Volta): power is sampled and integrated")
            except nvml.NVMLError as err:
                self.notes.append(f"{where}: skipped, neither energy nor power is readable: {_error_name(nvml, err)}")
                return None
        except nvml.NVMLError as err:
            raise SourceFailed(
                f"{where}: nvmlDeviceGetTotalEnergyConsumption failed: {_error_name(nvml, err)} — "
                f"{_FIXES.get(type(err).__name__, 'check nvidia-smi')}"
            ) from err
        mig: bool | None
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
            mig = current == nvml.NVML_DEVICE_MIG_ENABLE
        except nvml.NVMLError:  # NotSupported before Ampere, FunctionNotFound on old drivers
            mig = None
        if mig:
            self.notes.append(
                f"{where}: MIG mode is enabled: NVML meters the whole GPU only, so its energy is reported for the "
                "whole GPU and not split between MIG instances, and per-process use is not available"
            )
        return NvmlZone(
            name=name,
            kind=kind,
            index=index,
            uuid=uuid,
            model=model,
            power_limit_watts=self._milli(nvml.nvmlDeviceGetEnforcedPowerLimit, handle),
            power_management_limit_watts=self._milli(nvml.nvmlDeviceGetPowerManagementLimit, handle),
            mig=mig,
            read_value=self._reader(name, where, handle, kind),
            clock=self.clock,
        )

    def _milli(self, function: Callable[[Any], int], handle: Any) -> float | None:
        try:
            return function(handle) / 1000.0
        except self.nvml.NVMLError:
            return None

    def _reader(self, name: str, where: str, handle: Any, kind: ReadingKind) -> Callable[[], float]:
        nvml = self.nvml
        function = nvml.nvmlDeviceGetTotalEnergyConsumption if kind == "counter" else nvml.nvmlDeviceGetPowerUsage

        def read() -> float:
            if not self._open:
                raise SourceFailed(f"{where}: the source was closed")
            try:
                return float(function(handle)) / 1000.0  # mJ -> J, mW -> W
            except nvml.NVMLError as err:
                raise SourceFailed(
                    f"{where}: {function.__name__} failed: {_error_name(nvml, err)} — "
                    f"{_FIXES.get(type(err).__name__, 'check nvidia-smi')}"
                ) from err

        return read

    # -- extras the agent uses --
    def power_limits(self) -> dict[str, float]:
        """Enforced power limit per GPU in watts, read now (it changes when an administrator sets it)."""
        limits: dict[str, float] = {}
        for zone in self._zones:
            watts = self._milli(self.nvml.nvmlDeviceGetEnforcedPowerLimit, self._handles[zone.name])
            if watts is not None:
                limits[zone.name] = watts
        return limits

    def instantaneous_power(self) -> dict[str, float]:
        """NVML's own power reading per GPU in watts (``nvmlDeviceGetPowerUsage``), for display and checks."""
        watts: dict[str, float] = {}
        for zone in self._zones:
            value = self._milli(self.nvml.nvmlDeviceGetPowerUsage, self._handles[zone.name])
            if value is not None:
                watts[zone.name] = value
        return watts

    def process_utilisation(self) -> dict[int, dict[str, float]]:
        """Per process, its share of each GPU's sampled SM time since the previous call (0..1)."""
        nvml = self.nvml
        result: dict[int, dict[str, float]] = {}
        with self._lock:
            for zone in self._zones:
                if zone.mig or zone.name in self._no_process_util:
                    continue
                last = self._last_seen.get(zone.name, 0)
                try:
                    samples = nvml.nvmlDeviceGetProcessUtilization(self._handles[zone.name], last)
                except nvml.NVMLError_NotFound:
                    continue  # no sample newer than `last`: no process ran
                except nvml.NVMLError_NotSupported:
                    self._no_process_util.add(zone.name)
                    self.notes.append(f"{NAME} {zone.name} ({zone.model}): per-process utilisation not supported")
                    continue
                except nvml.NVMLError as err:
                    if getattr(err, "value", None) == nvml.NVML_SUCCESS:
                        continue  # the wrapper raises NVMLError(0) when the first call finds zero samples
                    raise SourceFailed(
                        f"{NAME} {zone.name} ({zone.model}): nvmlDeviceGetProcessUtilization failed: "
                        f"{_error_name(nvml, err)} — {_FIXES.get(type(err).__name__, 'check nvidia-smi')}"
                    ) from err
                busy: dict[int, float] = {}
                instants: set[int] = set()
                newest = last
                for sample in samples:
                    stamp = int(sample.timeStamp)
                    if stamp <= last or sample.pid <= 0:
                        continue
                    instants.add(stamp)
                    busy[int(sample.pid)] = busy.get(int(sample.pid), 0.0) + min(max(int(sample.smUtil), 0), 100)
                    newest = max(newest, stamp)
                self._last_seen[zone.name] = newest
                for pid, percent in busy.items():
                    result.setdefault(pid, {})[zone.name] = min(1.0, percent / (100.0 * len(instants)))
        return result

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass


def _import_pynvml() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError as err:
        raise SourceAbsent(f"{NAME}: the pynvml module is not installed — pip install nvidia-ml-py") from err


def open_source(options: dict[str, object], roots: Roots, clock: Clock | None = None) -> Nvml:
    """Open NVML and list the GPUs.

    Options: ``devices`` (list of GPU indices, ``gpu-<index>`` names or UUIDs; default all),
    ``clock`` (callable, default time.time).
    """
    if clock is not None:  # the sampler's clock (the registry passes it), over options["clock"]
        options = {**options, "clock": clock}
    problems: list[str] = []
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        problems.append(f"unknown options {', '.join(unknown)} (known: {', '.join(sorted(OPTIONS))})")
    clock_option = options.get("clock", time.time)
    if not callable(clock_option):
        problems.append(f"clock: must be callable, got {clock_option!r}")
    devices = options.get("devices")
    wanted: list[str] | None = None
    if devices is not None:
        if (
            not isinstance(devices, list | tuple)
            or not devices
            or not all(isinstance(d, int | str) and not isinstance(d, bool) for d in devices)
        ):
            problems.append(
                f"devices: must be a non-empty list of GPU indices, gpu-<index> names or UUIDs, got {devices!r}"
            )
        else:
            wanted = [str(d) for d in devices]
    if problems:
        raise SourceFailed(f"{NAME}: invalid options — " + "; ".join(problems))
    nvml = _import_pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_LibraryNotFound as err:
        raise SourceAbsent(
            f"{NAME}: libnvidia-ml.so.1 not found — no NVIDIA driver on this host (in a container: run it with the "
            "NVIDIA container toolkit, runtimeClassName nvidia)"
        ) from err
    except nvml.NVMLError_DriverNotLoaded as err:
        raise SourceAbsent(
            f"{NAME}: the NVIDIA kernel driver is not loaded (no GPU, or the driver is not installed)"
        ) from err
    except nvml.NVMLError as err:
        raise SourceFailed(
            f"{NAME}: nvmlInit failed: {_error_name(nvml, err)} — {_FIXES.get(type(err).__name__, 'check nvidia-smi')}"
        ) from err
    source = Nvml(nvml, clock_option if callable(clock_option) else time.time)
    try:
        source.discover(wanted)
    except BaseException:
        source.close()
        raise
    return source


__all__ = ["NAME", "Nvml", "NvmlZone", "open_source"]
