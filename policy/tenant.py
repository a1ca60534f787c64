"""Tenant mode: a VM's part of its physical server's energy, and that part split over its pods.

The provider measures the physical server and pushes its energy per aligned window of ``g``
seconds (NADIKI's time series); the tenant sees only its VM, through standard exporters. Two
steps, both stated policies rather than guesses:

1. **The VM's share of its server** (``share``):

   * ``vcpu`` — ``share = vCPUs of the VM / logical CPUs of the server``: the server's
     registered cores (the registrar's ``installed_cpus[].physical_core_count``) × threads per
     core. It charges the VM for its reservation, idle power included, as a provider charges
     for a VM whether it is busy or not.
   * ``provider`` — a figure the provider states for the VM (a number in 0..1), used as is.

   ``E_vm = share × E_server`` for every window.

2. **The VM's energy over its pods** in each interval, by CPU time (cAdvisor's
   ``container_cpu_usage_seconds_total``)::

       pod p = E_vm × cpu_p / Σ_q cpu_q

   Σ over every pod on the VM, kube-system's included, so ``Σ pods = E_vm`` whenever the pods
   used CPU; an interval in which no pod did keeps its energy as ``unattributed`` (never
   dropped). An interval whose server energy is missing (a window the provider did not push)
   is NaN for every pod and for ``unattributed``: a gap, not a zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from joulesched.policy.errors import PolicyError

FloatArray = npt.NDArray[np.float64]
SHARE_POLICIES = ("vcpu", "provider")


class ShareError(PolicyError, ValueError):
    """A VM's share of its server cannot be computed from what is known (the message says why)."""


def vcpu_share(vm_vcpus: float, server_cores: float, threads_per_core: float) -> float:
    """The VM's vCPUs over the server's logical CPUs (``cores × threads_per_core``)."""
    if not (math.isfinite(vm_vcpus) and vm_vcpus > 0):
        raise ShareError(f"the VM's vCPU count must be > 0, got {vm_vcpus!r}")
    logical = server_cores * threads_per_core
    if not (math.isfinite(logical) and logical > 0):
        raise ShareError(
            f"the server's logical CPUs (cores {server_cores!r} × threads per core {threads_per_core!r}) must be > 0"
        )
    if vm_vcpus > logical:
        raise ShareError(
            f"the VM has {vm_vcpus:g} vCPUs but its server only {logical:g} logical CPUs: the vCPU share would exceed 1 "
            "(overcommitted host?) — state the provider's per-VM share instead"
        )
    return vm_vcpus / logical


def provider_share(value: float) -> float:
    if not (math.isfinite(value) and 0 < value <= 1):
        raise ShareError(f"the provider's share of the server must be in (0, 1], got {value!r}")
    return value


def step_energy(
    window_starts: Sequence[float] | FloatArray,
    window_joules: Sequence[float] | FloatArray,
    granularity: float,
    step_ends: Sequence[float] | FloatArray,
    step: float,
) -> FloatArray:
    """Joules per interval ``(end − step, end]`` from whole windows ``[start, start + g)``.

    ``step`` must be a whole multiple of ``g`` and the intervals aligned on ``g``: then each
    interval is exactly ``step / g`` windows, and the intervals add up to the windows. An
    interval missing any of its windows is NaN.
    """
    g = float(granularity)
    per = step / g
    if not (g > 0 and per >= 1 and abs(per - round(per)) < 1e-9):
        raise ShareError(f"the step ({step:g} s) must be a whole multiple of the server's window ({g:g} s)")
    ends = np.asarray(step_ends, dtype=np.float64)
    first = ends - step
    if ends.size and np.any(np.abs(first / g - np.round(first / g)) > 1e-9):
        raise ShareError(f"the intervals must start on multiples of the server's window ({g:g} s)")
    starts = np.asarray(window_starts, dtype=np.float64)
    joules = np.asarray(window_joules, dtype=np.float64)
    by_index = {round(s / g): j for s, j in zip(starts.tolist(), joules.tolist(), strict=True)}
    count = round(per)
    out = np.full(ends.shape, np.nan)
    for k, lo in enumerate(first.tolist()):
        first_window = round(lo / g)
        parts = [by_index.get(first_window + i) for i in range(count)]
        if all(p is not None and math.isfinite(p) for p in parts):
            out[k] = math.fsum(p for p in parts if p is not None)
    return out


def span_energy(
    window_starts: Sequence[float] | FloatArray,
    window_joules: Sequence[float] | FloatArray,
    granularity: float,
    t0: float,
    t1: float,
) -> float:
    """The server's joules over ``[t0, t1]``: each window overlapping it × the overlapped fraction.

    Within a window the power is taken as constant (the provider pushed nothing finer). NaN when
    a window overlapping the span is missing.
    """
    g = float(granularity)
    if not (g > 0 and t1 > t0):
        raise ShareError(f"span [{t0}, {t1}] or window {g} s is empty")
    by_index = {round(s / g): float(j) for s, j in zip(window_starts, window_joules, strict=True)}
    total = []
    for k in range(math.floor(t0 / g), math.ceil(t1 / g)):
        if k not in by_index:
            return math.nan
        overlap = min(t1, (k + 1) * g) - max(t0, k * g)
        total.append(by_index[k] * overlap / g)
    return math.fsum(total)


def counter_increase(
    times: Sequence[float], values: Sequence[float], edges: Sequence[float] | FloatArray
) -> FloatArray:
    """A cumulative counter's growth in each interval ``(edges[i], edges[i+1]]``.

    The counter is linear between its samples, so the growth between two samples is split over
    the intervals by time: the intervals add up to the counter's growth between its first and
    last sample, wherever the samples fall. A drop is a restart from zero (the new value is the
    growth since the restart, Prometheus' rule for counters). Nothing is assumed before the
    first sample or after the last.
    """
    e = np.asarray(edges, dtype=np.float64)
    out = np.zeros(max(len(e) - 1, 0))
    for (t0, v0), (t1, v1) in zip(
        zip(times, values, strict=True), zip(times[1:], values[1:], strict=True), strict=False
    ):
        if not t1 > t0:
            continue
        grown = v1 - v0 if v1 >= v0 else v1
        lo = max(int(np.searchsorted(e, t0, side="right")) - 1, 0)
        hi = min(int(np.searchsorted(e, t1, side="left")), len(e) - 1)
        for k in range(lo, hi):
            overlap = min(t1, e[k + 1]) - max(t0, e[k])
            if overlap > 0:
                out[k] += grown * overlap / (t1 - t0)
    return out


def server_power_model(window_watts: Sequence[float] | FloatArray, rated_watts: float | None) -> tuple[float, float]:
    """``(idle, full)`` watts of a server known only by its pushed windows and its description.

    Idle is the lowest window's mean power in the history; full load the registered rated power
    (``rated_power``, kW in the spec) when it is above idle, else the highest window's. A linear
    curve between them is the profile: the tenant cannot see the host's utilisation, so nothing
    finer can be fitted.
    """
    watts = np.asarray(window_watts, dtype=np.float64)
    watts = watts[np.isfinite(watts)]
    if watts.size == 0:
        raise ShareError("no window of the server's energy in the history: no power model")
    idle = float(watts.min())
    full = float(rated_watts) if rated_watts is not None and rated_watts > idle else float(watts.max())
    return idle, max(full, idle)


def utilisation_on_line(idle_watts: float, full_watts: float, watts: float) -> float:
    """Where ``watts`` lies between idle and full power (0..1): the linear curve inverted."""
    if not full_watts > idle_watts:
        return 0.0
    return min(max((watts - idle_watts) / (full_watts - idle_watts), 0.0), 1.0)


def split_by_cpu(vm_joules: FloatArray, cpu_seconds: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(pods × intervals joules, unattributed joules per interval)`` (formula in the module doc).

    ``cpu_seconds`` is pods × intervals; NaN (a pod absent in an interval) counts as no CPU.
    """
    vm = np.asarray(vm_joules, dtype=np.float64)
    cpu = np.nan_to_num(np.asarray(cpu_seconds, dtype=np.float64), nan=0.0)
    if cpu.ndim != 2 or cpu.shape[1] != vm.shape[0]:
        raise ShareError(f"CPU seconds of shape {cpu.shape} do not match {vm.shape[0]} intervals")
    if np.any(cpu < 0):
        raise ShareError("CPU seconds must not be negative (a counter reset not handled by increase()?)")
    total = cpu.sum(axis=0)
    used = total > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        fraction = np.where(used, cpu / np.where(used, total, 1.0), 0.0)
    pods: FloatArray = fraction * vm
    pods[:, ~np.isfinite(vm)] = np.nan
    unattributed: FloatArray = np.where(used, 0.0, vm)
    unattributed[~np.isfinite(vm)] = np.nan
    return pods, unattributed


__all__ = [
    "SHARE_POLICIES",
    "ShareError",
    "counter_increase",
    "provider_share",
    "server_power_model",
    "span_energy",
    "split_by_cpu",
    "step_energy",
    "utilisation_on_line",
    "vcpu_share",
]
