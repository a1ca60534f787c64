"""nvml: a stand-in pynvml module answering like recorded boards (no GPU on the test machine)."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pynvml as real_pynvml
import pytest

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources import nvml
from joulesched.measurement.sources.base import Roots, Source, Zone
from tests.measurement.sources.fake_pynvml import FUNCTIONS, FakeGpu, gpu_fixtures, load_gpu, make_module


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Callable[..., ModuleType]:
    """Install a fake pynvml for these boards; return the module."""

    def install(*gpus: FakeGpu, init_error: int | None = None) -> ModuleType:
        module = make_module(list(gpus), init_error=init_error)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return install


def test_the_stand_in_has_the_real_modules_functions_and_parameters() -> None:
    fake = make_module([])
    for name in FUNCTIONS:
        real_params = list(inspect.signature(getattr(real_pynvml, name)).parameters)
        assert list(inspect.signature(getattr(fake, name)).parameters) == real_params, name
    assert fake.NVMLError_NotSupported is real_pynvml.NVMLError_NotSupported
    assert [f[0] for f in fake.c_nvmlProcessUtilizationSample_t._fields_] == [
        "pid",
        "timeStamp",
        "smUtil",
        "memUtil",
        "encUtil",
        "decUtil",
    ]


@pytest.mark.parametrize("hardware", gpu_fixtures())
def test_every_recorded_board_gives_one_gpu_zone(host: Callable[..., ModuleType], hardware: str) -> None:
    board = load_gpu(hardware)
    host(board)
    source = nvml.open_source({"clock": lambda: 42.0}, Roots())
    assert isinstance(source, Source)
    (zone,) = source.zones()
    assert isinstance(zone, Zone)
    assert (zone.name, zone.domain, zone.max_joules, zone.parent) == ("gpu-0", "gpu", None, None)
    assert (zone.model, zone.uuid) == (board.name, board.uuid)
    assert zone.power_limit_watts == board.limit_mw / 1000
    assert zone.mig == (None if board.mig is None else board.mig[0] == 1)
    reading = zone.read()
    if board.energy_mj is not None:
        assert zone.kind == "counter"
        assert reading.value == pytest.approx(board.energy_mj / 1000)  # mJ -> J
    else:
        assert zone.kind == "power"
        assert reading.value == pytest.approx(board.power_mw / 1000)  # mW -> W
        assert any("no energy counter" in note for note in source.notes)
    assert reading.timestamp == 42.0
    source.close()


def test_a_mixed_host_lists_every_gpu_with_its_own_mechanism(host: Callable[..., ModuleType]) -> None:
    module = host(load_gpu("nvidia-h100-80gb-hbm3"), load_gpu("tesla-p100-pcie-16gb"), load_gpu("tesla-t4"))
    source = nvml.open_source({}, Roots())
    assert [(z.name, z.kind) for z in source.zones()] == [
        ("gpu-0", "counter"),
        ("gpu-1", "power"),
        ("gpu-2", "counter"),
    ]
    assert source.power_limits() == {"gpu-0": 700.0, "gpu-1": 250.0, "gpu-2": 70.0}
    module.gpus[0].energy_mj += 350_000  # 350 J later
    assert source.zones()[0].read().value == pytest.approx((98_765_432 + 350_000) / 1000)
    assert source.describe()["driver"] == "550.54.15"
    source.close()
    assert module.state["shutdowns"] == 1
    with pytest.raises(SourceFailed, match="closed"):
        source.zones()[0].read()


def test_mig_mode_keeps_whole_gpu_power_and_says_so(host: Callable[..., ModuleType]) -> None:
    host(load_gpu("nvidia-a100-sxm4-80gb-mig", samples=[(100, 10, 50)]))
    source = nvml.open_source({}, Roots())
    (zone,) = source.zones()
    assert zone.mig is True and zone.kind == "counter"
    assert any("MIG mode is enabled" in n and "not split between MIG instances" in n for n in source.notes)
    assert source.process_utilisation() == {}, "no per-process split is invented for MIG"


def test_process_utilisation_weighs_processes_by_sampled_time(host: Callable[..., ModuleType]) -> None:
    module = host(load_gpu("nvidia-a100-sxm4-80gb"), load_gpu("tesla-t4"))
    gpu0 = module.gpus[0]
    gpu0.samples = [(100, 1_000, 50), (100, 2_000, 50), (100, 3_000, 50), (200, 2_000, 40)]
    source = nvml.open_source({}, Roots())
    shares = source.process_utilisation()
    assert shares == {100: {"gpu-0": pytest.approx(0.5)}, 200: {"gpu-0": pytest.approx(40 / 300)}}
    assert source.process_utilisation() == {}, "nothing new since the previous call (NVML: Not Found)"
    gpu0.samples.append((200, 4_000, 90))
    assert source.process_utilisation() == {200: {"gpu-0": pytest.approx(0.9)}}


def test_process_utilisation_not_supported_is_noted_once(host: Callable[..., ModuleType]) -> None:
    host(load_gpu("tesla-t4", process_util_error=real_pynvml.NVML_ERROR_NOT_SUPPORTED))
    source = nvml.open_source({}, Roots())
    assert source.process_utilisation() == {}
    assert source.process_utilisation() == {}
    assert sum("per-process utilisation not supported" in n for n in source.notes) == 1


def test_a_lost_gpu_fails_the_read_naming_board_and_fix(host: Callable[..., ModuleType]) -> None:
    module = host(load_gpu("nvidia-h100-80gb-hbm3"))
    source = nvml.open_source({}, Roots())
    module.gpus[0].lost = True
    with pytest.raises(
        SourceFailed,
        match=r"nvml gpu-0 \(NVIDIA H100 80GB HBM3, GPU-8a1f.*\): "
        r"nvmlDeviceGetTotalEnergyConsumption failed: NVMLError_GpuIsLost.*dmesg",
    ):
        source.zones()[0].read()


@pytest.mark.parametrize(
    ("error", "expected", "message"),
    [
        (real_pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, SourceAbsent, "libnvidia-ml.so.1 not found"),
        (real_pynvml.NVML_ERROR_DRIVER_NOT_LOADED, SourceAbsent, "driver is not loaded"),
        (real_pynvml.NVML_ERROR_NO_PERMISSION, SourceFailed, "nvmlInit failed: NVMLError_NoPermission.*root"),
    ],
    ids=["no library: absent", "no driver: absent", "no permission: failed, with the fix"],
)
def test_nvml_that_cannot_start(host: Callable[..., ModuleType], error: int, expected: type, message: str) -> None:
    host(init_error=error)
    with pytest.raises(expected, match=message):
        nvml.open_source({}, Roots())


def test_a_driver_without_gpus_is_absent(host: Callable[..., ModuleType]) -> None:
    module = host()
    with pytest.raises(SourceAbsent, match="reports no GPU"):
        nvml.open_source({}, Roots())
    assert module.state["shutdowns"] == 1, "NVML is shut down again when the source is not opened"


def test_without_the_module_the_source_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(SourceAbsent, match="pip install nvidia-ml-py"):
        nvml.open_source({}, Roots())


def test_devices_option_selects_by_index_or_uuid(host: Callable[..., ModuleType]) -> None:
    t4 = load_gpu("tesla-t4")
    host(load_gpu("nvidia-a100-sxm4-80gb"), t4)
    assert [z.name for z in nvml.open_source({"devices": [t4.uuid]}, Roots()).zones()] == ["gpu-1"]
    assert [z.name for z in nvml.open_source({"devices": [0]}, Roots()).zones()] == ["gpu-0"]
    with pytest.raises(SourceFailed, match=r"devices gpu-7 .* not found among the 2 GPUs"):
        nvml.open_source({"devices": ["gpu-7"]}, Roots())
    with pytest.raises(SourceFailed, match="unknown options colour"):
        nvml.open_source({"colour": "green"}, Roots())


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has a GPU")
def test_the_real_module_on_a_machine_without_gpu_is_absent() -> None:
    with pytest.raises(SourceAbsent):
        nvml.open_source({}, Roots())


def _gpu_check() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "bench" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_script_reports_nvml_absent_here(capsys: pytest.CaptureFixture[str]) -> None:
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has a GPU")
    assert _gpu_check().main(["--load", "none"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "NVML absent"


def test_gpu_check_script_reads_a_stand_in_gpu(
    host: Callable[..., ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    host(load_gpu("nvidia-h100-80gb-hbm3"), load_gpu("tesla-p100-pcie-16gb"))
    assert _gpu_check().main(["--seconds", "0.2", "--load", "none"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "ok"
    assert [(g["zone"], g["kind"], g["power_limit_watts"]) for g in report["gpus"]] == [
        ("gpu-0", "counter", 700.0),
        ("gpu-1", "power", 250.0),
    ]


def test_the_registry_opens_it_by_name_with_the_samplers_clock(host: Callable[..., ModuleType]) -> None:
    from joulesched.measurement.sources.registry import open_one

    host(load_gpu("tesla-t4"))
    source = open_one("nvml", {}, Roots(), clock=lambda: 9.0)
    assert source.zones()[0].read().timestamp == 9.0
