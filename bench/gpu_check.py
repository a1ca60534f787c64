#!/usr/bin/env python3
"""Check the NVML path of the agent on a real GPU machine; print what it read as JSON.

    python bench/gpu_check.py [--seconds 5] [--load auto|none] [--require]

It opens the ``nvml`` source exactly as the agent does, lists every GPU (model, UUID, zone kind,
power limits, MIG mode), reads each zone, runs a small load for ``--seconds`` (a half-precision
matrix multiply on every GPU, with torch if installed, else cupy; idle if neither or with
``--load none``), reads again and reports the energy counter's delta, the mean power it implies,
NVML's instantaneous power for comparison, and the per-process utilisation the source saw (this
process must appear on a loaded GPU unless it is in MIG mode). ``checks`` says which invariants
held; the exit status is 0 when all did, 1 otherwise.

Without NVML (no driver, no GPU, as on CI) it prints ``{"status": "NVML absent", ...}`` and exits
0, or 1 with ``--require``. Nothing in the test suite runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from joulesched.measurement.errors import SourceAbsent, SourceFailed
from joulesched.measurement.sources import nvml
from joulesched.measurement.sources.base import Roots


def start_load(seconds: float, mode: str) -> tuple[str, threading.Thread | None, list[str]]:
    """Start a matrix-multiply load on every CUDA device in a thread; return (library, thread, errors)."""
    errors: list[str] = []
    if mode == "none":
        return "none", None, errors
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA indices = NVML indices
    try:
        import torch

        if not torch.cuda.is_available():
            raise ImportError("torch without CUDA")

        def run_torch() -> None:
            try:
                deadline = time.monotonic() + seconds
                mats = []
                for d in range(torch.cuda.device_count()):
                    a = torch.randn(8192, 8192, device=f"cuda:{d}", dtype=torch.float16)
                    mats.append((a, a.clone()))
                while time.monotonic() < deadline:
                    for a, b in mats:
                        torch.matmul(a, b)
                    torch.cuda.synchronize()
            except Exception as err:  # report, do not crash the check
                errors.append(f"torch load: {err!r}")

        thread = threading.Thread(target=run_torch, daemon=True)
        thread.start()
        return "torch", thread, errors
    except ImportError:
        pass
    try:
        import cupy

        def run_cupy() -> None:
            try:
                deadline = time.monotonic() + seconds
                mats = []
                for d in range(cupy.cuda.runtime.getDeviceCount()):
                    with cupy.cuda.Device(d):
                        a = cupy.random.random((8192, 8192)).astype(cupy.float16)
                        mats.append((d, a, a.copy()))
                while time.monotonic() < deadline:
                    for d, a, b in mats:
                        with cupy.cuda.Device(d):
                            cupy.matmul(a, b)
                    for d, _, _ in mats:
                        cupy.cuda.Device(d).synchronize()
            except Exception as err:
                errors.append(f"cupy load: {err!r}")

        thread = threading.Thread(target=run_cupy, daemon=True)
        thread.start()
        return "cupy", thread, errors
    except ImportError:
        return "none (neither torch nor cupy installed: idle)", None, errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="load duration between the two reads (default 5)")
    parser.add_argument("--load", choices=("auto", "none"), default="auto", help="run a GPU load (default auto)")
    parser.add_argument("--require", action="store_true", help="exit 1 when NVML is absent")
    args = parser.parse_args(argv)

    report: dict[str, Any] = {"host": os.uname().nodename, "pid": os.getpid()}
    try:
        source = nvml.open_source({}, Roots())
    except SourceAbsent as err:
        report.update(status="NVML absent", reason=str(err))
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return 1 if args.require else 0
    except SourceFailed as err:
        report.update(status="NVML failed", reason=str(err))
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return 1

    checks: dict[str, bool] = {}
    try:
        report["driver"] = source.driver_version
        report["notes"] = list(source.notes)
        zones = source.zones()
        first = {z.name: z.read() for z in zones}
        source.process_utilisation()  # start the per-process window now
        library, thread, load_errors = start_load(args.seconds, args.load)
        report["load"] = library
        instantaneous: dict[str, list[float]] = {z.name: [] for z in zones}
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            for name, watts in source.instantaneous_power().items():
                instantaneous[name].append(watts)
            time.sleep(0.2)
        if thread is not None:
            thread.join(timeout=args.seconds + 30)
        processes = source.process_utilisation()
        second = {z.name: z.read() for z in zones}
        report["load_errors"] = load_errors
        gpus = []
        for z in zones:
            a, b = first[z.name], second[z.name]
            dt = b.timestamp - a.timestamp
            entry: dict[str, Any] = {
                "zone": z.name,
                "model": z.model,
                "uuid": z.uuid,
                "kind": z.kind,
                "mig": z.mig,
                "power_limit_watts": z.power_limit_watts,
                "power_management_limit_watts": z.power_management_limit_watts,
                "first": a.value,
                "second": b.value,
                "seconds": round(dt, 3),
                "instantaneous_watts": {
                    "min": min(instantaneous[z.name], default=None),
                    "max": max(instantaneous[z.name], default=None),
                    "mean": sum(instantaneous[z.name]) / len(instantaneous[z.name]) if instantaneous[z.name] else None,
                },
            }
            if z.kind == "counter":
                delta = b.value - a.value
                entry["energy_joules"] = delta
                entry["mean_watts"] = delta / dt if dt > 0 else None
                checks[f"{z.name}: energy counter does not go backwards"] = delta >= 0
                if z.power_limit_watts and dt > 0:
                    checks[f"{z.name}: mean power within 110 % of the limit"] = delta / dt <= 1.1 * z.power_limit_watts
                means = entry["instantaneous_watts"]["mean"]
                if means and dt > 0 and delta > 0:
                    entry["counter_over_instantaneous_ratio"] = (delta / dt) / means
            else:
                checks[f"{z.name}: power is positive"] = b.value > 0
            if library.startswith(("torch", "cupy")) and not z.mig and not load_errors:
                share = processes.get(os.getpid(), {}).get(z.name)
                entry["this_process_share"] = share
                checks[f"{z.name}: this process appears in its per-process utilisation"] = share is not None
            gpus.append(entry)
        report["gpus"] = gpus
        report["process_utilisation"] = {str(pid): shares for pid, shares in processes.items()}
        report["power_limits"] = source.power_limits()
        report["notes"] = list(source.notes)
    except SourceFailed as err:
        report["error"] = str(err)
        checks["reads succeed"] = False
    finally:
        source.close()
    report["checks"] = checks
    report["status"] = "ok" if all(checks.values()) else "check failed"
    print(json.dumps(report, indent=2, default=str, ensure_ascii=False))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
