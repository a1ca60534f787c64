"""A stand-in for the ``pynvml`` module (nvidia-ml-py) that answers like recorded GPUs.

Only the functions are replaced. The error classes (``NVMLError`` and its generated
``NVMLError_*`` subclasses), the ``NVML_*`` constants and the ctypes structure
``c_nvmlProcessUtilizationSample_t`` are the real module's own objects, so that ``except
pynvml.NVMLError_NotSupported`` and the sample fields (``pid, timeStamp, smUtil, memUtil, encUtil,
decUtil``) behave exactly as on a GPU machine. :data:`FUNCTIONS` lists the replaced functions;
a test checks that each exists in the real module with the same parameters.

Each :class:`FakeGpu` comes from ``fixtures/nvml/<hardware>.json``, modelled on a real board (the
name as NVML reports it, the power limit of the board's specification, MIG support by
generation); energy and power values are constructed, not captured.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass, field
from pathlib import Path

import pynvml as real

FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetProcessUtilization",
)


@dataclass
class FakeGpu:
    name: str
    uuid: str
    energy_mj: int | None  # None: nvmlDeviceGetTotalEnergyConsumption not supported (before Volta)
    power_mw: int
    limit_mw: int
    mig: tuple[int, int] | None = None  # (current, pending); None: not supported (before Ampere)
    samples: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, timeStamp µs, smUtil %)
    process_util_error: int | None = None  # an NVML_ERROR_* code to raise instead
    lost: bool = False  # every call raises GPU_IS_LOST


NVML_FIXTURES = Path(__file__).parent / "fixtures" / "nvml"


def gpu_fixtures() -> list[str]:
    return sorted(p.stem for p in NVML_FIXTURES.glob("*.json"))


def load_gpu(hardware: str, **changes: object) -> FakeGpu:
    """The recorded answers of one board (``fixtures/nvml/<hardware>.json``), with changes."""
    data = json.loads((NVML_FIXTURES / f"{hardware}.json").read_text())
    data["mig"] = tuple(data["mig"]) if data["mig"] is not None else None
    data.update(changes)
    return FakeGpu(**data)


class _Handle:
    """Stands for the real ``c_nvmlDevice_t``: opaque to callers."""

    def __init__(self, index: int) -> None:
        self.index = index


def make_module(gpus: list[FakeGpu], *, init_error: int | None = None) -> types.ModuleType:
    """A ``pynvml`` module for these GPUs; ``init_error`` makes nvmlInit raise that NVML_ERROR_* code."""
    module = types.ModuleType("pynvml")
    for name in dir(real):  # the real error classes, constants and structures
        if name.startswith(("NVMLError", "NVML_", "c_nvml")):
            setattr(module, name, getattr(real, name))
    NVMLError = real.NVMLError
    state = {"initialised": 0, "shutdowns": 0}
    module.state = state  # type: ignore[attr-defined]
    module.gpus = gpus  # type: ignore[attr-defined]

    def gpu(handle: _Handle) -> FakeGpu:
        if not state["initialised"]:
            raise NVMLError(real.NVML_ERROR_UNINITIALIZED)
        device = gpus[handle.index]
        if device.lost:
            raise NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        return device

    def nvmlInit() -> None:
        if init_error is not None:
            raise NVMLError(init_error)
        state["initialised"] += 1

    def nvmlShutdown() -> None:
        state["initialised"] -= 1
        state["shutdowns"] += 1

    def nvmlSystemGetDriverVersion() -> str:
        return "550.54.15"

    def nvmlDeviceGetCount() -> int:
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
        if not 0 <= index < len(gpus):
            raise NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetName(handle: _Handle) -> str:
        return gpu(handle).name

    def nvmlDeviceGetUUID(handle: _Handle) -> str:
        return gpu(handle).uuid

    def nvmlDeviceGetTotalEnergyConsumption(handle: _Handle) -> int:
        device = gpu(handle)
        if device.energy_mj is None:
            raise NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return device.energy_mj

    def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
        return gpu(handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
        return gpu(handle).limit_mw

    def nvmlDeviceGetPowerManagementLimit(handle: _Handle) -> int:
        return gpu(handle).limit_mw

    def nvmlDeviceGetMigMode(device: _Handle) -> list[int]:
        board = gpu(device)
        if board.mig is None:
            raise NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return [board.mig[0], board.mig[1]]

    def nvmlDeviceGetProcessUtilization(handle: _Handle, timeStamp: int) -> list[real.c_nvmlProcessUtilizationSample_t]:
        device = gpu(handle)
        if device.mig is not None and device.mig[0] == real.NVML_DEVICE_MIG_ENABLE:
            raise NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        if device.process_util_error is not None:
            raise NVMLError(device.process_util_error)
        newer = [s for s in device.samples if s[1] > timeStamp]
        if not device.samples:
            # the real wrapper: the first call returns SUCCESS with count 0, which it raises as NVMLError(0)
            raise NVMLError(real.NVML_SUCCESS)
        if not newer:
            raise NVMLError(real.NVML_ERROR_NOT_FOUND)
        out = []
        for pid, stamp, sm in newer:
            sample = real.c_nvmlProcessUtilizationSample_t()
            sample.pid, sample.timeStamp, sample.smUtil, sample.memUtil, sample.encUtil, sample.decUtil = (
                pid,
                stamp,
                sm,
                sm // 2,
                0,
                0,
            )
            out.append(sample)
        return out

    for name in FUNCTIONS:
        setattr(module, name, locals()[name])
    return module
