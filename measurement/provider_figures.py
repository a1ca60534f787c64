"""The provider's figures for a command run on a VM (``joulesched measure --server-id …``).

On a VM the hardware counters are the provider's, but the provider may push the physical
server's energy to the NADIKI side (``measurement.nadiki``, docs/provider.md). ``measure`` reads
it back for the command's span ``[t0, t1]`` (``contracts.nadiki_read``) and charges::

    server  = Σ windows overlapping [t0, t1] × the overlapped fraction   (policy.tenant.span_energy)
    VM      = server × share          share: --vm-share (the provider's figure), else the VM's
                                      vCPUs ÷ the server's logical CPUs (policy.tenant.vcpu_share)
    command = VM × the command's CPU seconds ÷ the VM's busy CPU seconds over the span (/proc/stat;
              at least the command's own)

The provider pushes a window some tens of seconds after it ends; ``measure`` waits for the last
one up to ``wait_s`` and otherwise says what is missing (the caller then estimates). Labelled
*provider's figures* everywhere, with the share's method.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from joulesched.contracts.errors import NadikiReadError
from joulesched.contracts.nadiki_read import ENERGY_FIELD, InfluxReader, RegistrarReader
from joulesched.measurement.errors import MeasurementError
from joulesched.policy import tenant


class ProviderFiguresUnavailable(MeasurementError):
    """The provider's figures could not be read or are not there (yet); the message says what to do."""


@dataclass(frozen=True)
class ProviderFigure:
    joules: float  # the command's
    server_joules: float
    vm_joules: float
    share: float
    share_method: str
    cpu_fraction: float
    cpu_seconds: float
    vm_busy_seconds: float
    windows: int
    granularity: int
    server_id: str
    method: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class ProviderAccess:
    registrar: RegistrarReader
    influx: InfluxReader
    server_id: str
    vm_share: float | None = None  # the provider's figure
    threads_per_core: int = 2
    wait_s: float = 90.0


def provider_energy(
    access: ProviderAccess,
    t0: float,
    t1: float,
    cpu_seconds: float,
    vm_busy_seconds: float | None,
    vm_cpus: int,
    *,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> ProviderFigure:
    sid = access.server_id
    try:
        server = access.registrar.server(sid)
    except NadikiReadError as err:
        raise ProviderFiguresUnavailable(f"the provider's registrar does not describe server {sid}: {err}") from err
    point = server.point(ENERGY_FIELD)
    if point is None:
        raise ProviderFiguresUnavailable(f"server {sid} pushes no {ENERGY_FIELD} series (the registrar's dataPoints)")
    try:
        if access.vm_share is not None:
            share, how = tenant.provider_share(access.vm_share), "the provider's figure (--vm-share)"
        else:
            share = tenant.vcpu_share(vm_cpus, server.physical_cores, access.threads_per_core)
            how = (
                f"this VM's {vm_cpus} vCPUs ÷ the server's {server.physical_cores} cores × "
                f"{access.threads_per_core} threads"
            )
    except tenant.ShareError as err:
        raise ProviderFiguresUnavailable(f"server {sid}: {err}") from err
    g = point.granularity_seconds
    deadline = clock() + access.wait_s
    while True:
        try:
            windows = access.influx.windows(point, sid, math.floor(t0 / g) * g, math.ceil(t1 / g) * g)
        except NadikiReadError as err:
            raise ProviderFiguresUnavailable(f"the provider's time series: {err}") from err
        joules = tenant.span_energy(windows.starts, windows.joules, g, t0, t1)
        if math.isfinite(joules):
            break
        if clock() >= deadline:
            raise ProviderFiguresUnavailable(
                f"the provider has not pushed every {g}-second window of server {sid} from {t0:.0f} to {t1:.0f} "
                f"after waiting {access.wait_s:g} s — run again with a longer --provider-wait, or ask the provider "
                "whether its agent is pushing"
            )
        sleep(min(5.0, max(0.1, deadline - clock())))
    busy = max(vm_busy_seconds if vm_busy_seconds is not None else cpu_seconds, cpu_seconds)
    fraction = cpu_seconds / busy if busy > 0 else 0.0
    vm = share * joules
    return ProviderFigure(
        joules=vm * fraction,
        server_joules=joules,
        vm_joules=vm,
        share=share,
        share_method=how,
        cpu_fraction=fraction,
        cpu_seconds=cpu_seconds,
        vm_busy_seconds=busy,
        windows=len(windows.starts),
        granularity=g,
        server_id=sid,
        method=(
            f"provider's figures: server {sid}'s energy over the run ({len(windows.starts)} window(s) of {g} s) × "
            f"{share:.4g} ({how}) × the command's {100 * fraction:.3g} % of the VM's busy CPU time"
        ),
    )


__all__ = ["ProviderAccess", "ProviderFigure", "ProviderFiguresUnavailable", "provider_energy"]
