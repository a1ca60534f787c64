"""The provider half of a tenant-mode test, for real: servers registered with the registrar
(tests/measurement/nadiki's loopback registrar) through the agent's own ``RegistrarClient``, and
their energy turned into windows by the agent's ``Pusher`` and written, as the exact line
protocol it produces, into a real ``influxd`` (Debian's InfluxDB 1.6, whose ``/write`` takes the
same body as InfluxDB 2's ``/api/v2/write``; 1.6 has no v2 endpoint, so the writer posts there).

Each server draws ``base + swing·sin(2π(t − T0)/900)`` watts; the agent samples its counter
(the exact integral) every 5 s. :func:`counter` is that integral, so a test compares what the
tenant computes with the server's true energy between two instants.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from joulesched.contracts.nadiki import Processor, ServerDescription
from joulesched.measurement.nadiki.pusher import CounterSample, Pusher
from joulesched.measurement.nadiki.registrar import RegistrarClient
from tests.influxdb_server import InfluxServer
from tests.measurement.nadiki.nadiki_support import RegistrarServer

T0 = 1654041600.0  # 2022-06-01T00:00:00Z (tests/impact/cluster.py's origin)
PERIOD = 900.0
SAMPLE_S = 5.0
BUCKET = "nadiki servers"  # the loopback registrar's bucket: the InfluxDB 1.x database


@dataclass(frozen=True)
class Host:
    facility: str
    rack: str
    base_watts: float
    swing_watts: float
    rated_kw: float
    cores_per_cpu: int = 16
    cpus: int = 2

    def description(self) -> ServerDescription:
        cpu = Processor("Intel", "Xeon Gold 6326", self.cores_per_cpu)
        return ServerDescription(
            self.facility,
            self.rack,
            rated_power=self.rated_kw,
            total_cpu_sockets=self.cpus,
            installed_cpus=(cpu,) * self.cpus,
        )

    def counter(self, t: float) -> float:
        """Joules since T0: the integral of the power."""
        x = t - T0
        return self.base_watts * x + self.swing_watts * PERIOD / (2 * math.pi) * (
            1 - math.cos(2 * math.pi * x / PERIOD)
        )


@dataclass
class Provider:
    registrar: RegistrarServer
    influx: InfluxServer
    servers: dict[str, Host]  # server id -> host

    @property
    def registrar_url(self) -> str:
        return self.registrar.registrar_url


def push(influx: InfluxServer, client: RegistrarClient, host: Host, first: float, last: float) -> str:
    """Register ``host`` and push its windows for samples from ``first`` to ``last``; its id."""
    registration = client.create(host.description().to_request())
    clock = [first]
    pusher = Pusher(
        registration.time_series,
        {"server_energy_consumption_joules": ("ipmi_dcmi",)},
        writer=lambda lines: influx.write(BUCKET, lines),
        clock=lambda: clock[0],
    )
    t = first
    while t <= last + 1e-9:
        clock[0] = t
        pusher.add(CounterSample(t, "ipmi_dcmi", host.counter(t)))
        if pusher.due():
            pusher.flush()
        t += SAMPLE_S
    pusher.flush()
    assert pusher.stats.lines_dropped_rejected == 0 and pusher.pending() == 0
    return registration.server_id


@contextmanager
def provider(
    workdir: Path, hosts: list[Host], first: float, last: float, credentials: tuple[str, str] | None = None
) -> Iterator[Provider]:
    influx = InfluxServer(workdir / "influxdb", credentials)
    try:
        influx.create_database(BUCKET)
        with RegistrarServer() as registrar:
            client = RegistrarClient(registrar.registrar_url)
            servers = {push(influx, client, host, first, last): host for host in hosts}
            yield Provider(registrar, influx, servers)
    finally:
        influx.stop()
