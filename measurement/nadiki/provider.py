"""Provider mode: register this physical server with a NADIKI registrar, then push its energy.

The seam with the agent is one iterable of :class:`~measurement.nadiki.pusher.CounterSample`
``(timestamp, source, joules_total)``; this module knows nothing of the sampler. The agent
builds it from its snapshots with :func:`counter_samples`, or from anything else that counts
joules::

    provider = Provider(parse_provider_config(doc["nadiki"]), roots, gpu_models=["NVIDIA H100 80GB HBM3"])
    registration = provider.register()          # POST /servers once; GET /servers/{id} afterwards
    threading.Thread(target=provider.run, args=(samples(), stop_event), daemon=True).start()

where ``samples()`` yields, once per agent interval, ``counter_samples(snapshot)``. The server id
(``registration.server_id``) is what the cluster's operator puts on the Kubernetes node as the
label ``joulesched.io/server-id`` (docs/provider.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from joulesched.contracts.net import plain_http_problem, redact, url_problem
from joulesched.measurement.nadiki.config import ProviderConfig
from joulesched.measurement.nadiki.errors import RegistrationFailed
from joulesched.measurement.nadiki.inventory import complete, discover
from joulesched.measurement.nadiki.model import Registration, ServerDescription, TimeSeriesConfig
from joulesched.measurement.nadiki.pusher import CounterSample, Pusher
from joulesched.measurement.nadiki.registrar import RegistrarClient, ensure_registration
from joulesched.measurement.sources.base import Roots

log = logging.getLogger(__name__)

NODE_LABEL = "joulesched.io/server-id"

# Which zones make up each source's total in counter_samples: never a sub-zone on top of its
# parent, never psys on top of packages, never core/uncore on top of their package.
PLATFORM_DOMAINS = frozenset({"platform"})
CPU_DOMAINS = frozenset({"package", "dram"})  # NADIKI's reference adds package and DRAM power as "cpu"
GPU_DOMAINS = frozenset({"gpu"})


def counter_samples(snapshot: Any) -> list[CounterSample]:
    """One CounterSample per source from an agent snapshot (``wall_time`` and ``zones`` of ZoneSnapshot).

    A source's total is the sum of its top-level zones (``parent`` None) in the domains that
    source contributes: platform for IPMI/Redfish, package + DRAM for RAPL, gpu for NVML.

    A source that is down, or one of whose zones is not being read (its power gauge absent:
    unread past ``stale_seconds``, or a gap), gives no sample: its total stands still while it
    is not read, and would be pushed as windows of 0 J, where the next source of the field is
    to fill them (docs/provider.md). Its next sample spans the time it was away, unless the
    agent could not measure some of it (``unmeasured_seconds`` grew: the windows restart).
    """
    down = {s.name for s in snapshot.sources if not s.up}
    totals: dict[str, float] = {}
    for zone in snapshot.zones:
        if zone.parent is not None:
            continue
        if zone.domain in PLATFORM_DOMAINS or zone.domain in CPU_DOMAINS or zone.domain in GPU_DOMAINS:
            if zone.present and zone.watts is None:
                down.add(zone.source)
            totals[zone.source] = totals.get(zone.source, 0.0) + float(zone.joules_total)
    for source in down:
        totals.pop(source, None)
    unmeasured: dict[str, float] = {}
    for source, _zone, _kind, seconds in (*snapshot.discarded, *snapshot.estimated):
        unmeasured[source] = unmeasured.get(source, 0.0) + seconds
    at = float(snapshot.wall_time)  # the time series is indexed by the time of day
    return [CounterSample(at, source, joules, unmeasured.get(source, 0.0)) for source, joules in sorted(totals.items())]


def samples_from_snapshots(snapshots: Iterable[Any]) -> Iterator[CounterSample]:
    for snapshot in snapshots:
        yield from counter_samples(snapshot)


def _read_token(path: str) -> str | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip()
    except OSError as err:
        raise RegistrationFailed(
            f"NADIKI registrar token file {path} (nadiki.registrar_token_file): {err.strerror or err} — create it "
            "(mode 0600) or remove the setting"
        ) from err
    if not token:
        raise RegistrationFailed(f"NADIKI registrar token file {path} is empty")
    return token


class Provider:
    """Registration, state and the push loop of one physical server."""

    def __init__(
        self,
        config: ProviderConfig,
        roots: Roots,
        *,
        gpu_models: Sequence[str] = (),
        clock: Callable[[], float] = time.time,
        wall: Callable[[], float] | None = None,
        writer: Callable[[Sequence[str]], None] | None = None,
    ) -> None:
        self.config = config
        self.roots = roots
        self.gpu_models = tuple(gpu_models)
        self.clock = clock  # the push loop's retries
        self.wall = wall or clock  # the time of day the registration is saved at
        self.writer = writer
        self.client = RegistrarClient(
            config.registrar_url, _read_token(config.registrar_token_file), config.ca_file or None, config.timeout_s
        )
        self.registration: Registration | None = None
        self.pusher: Pusher | None = None
        self.notes: list[str] = []

    def description(self) -> ServerDescription:
        """The configured description, completed from the host when ``server.discover`` is on."""
        if not self.config.discover:
            return self.config.server
        facts = discover(self.roots, self.gpu_models)
        self.notes += list(facts.notes)
        return complete(self.config.server, facts)

    def _endpoint_problem(self, time_series: TimeSeriesConfig) -> str | None:
        """Why the time-series token may not go to the endpoint the registrar handed out, or None
        (``url_problem`` and ``plain_http_problem``, as for the configured URLs)."""
        problem = url_problem(time_series.endpoint, "the registrar's timeSeriesConfig.token")
        if problem is None:
            problem = plain_http_problem(
                time_series.endpoint, "the time-series token", self.config.allow_plain_http, "nadiki.allow_plain_http"
            )
        if problem is None:
            return None
        return (
            f"NADIKI registrar {self.config.registrar_url}: the time-series endpoint it names"
            f" (timeSeriesConfig.endpoint {redact(time_series.endpoint)}) {problem}"
        )

    def register(self) -> Registration:
        registration, action = ensure_registration(
            self.client, self.description(), self.config.state_file, clock=self.wall
        )
        refused = self._endpoint_problem(registration.time_series)
        if refused:
            raise RegistrationFailed(refused + "; nothing is pushed until then")
        log.info(
            "NADIKI: server %s %s at %s (state %s); label the Kubernetes node %s=%s",
            registration.server_id,
            action,
            self.config.registrar_url,
            self.config.state_file,
            NODE_LABEL,
            registration.server_id,
        )
        self.registration = registration
        self.pusher = Pusher(
            registration.time_series,
            self.config.fields,
            precision=self.config.precision,
            max_gap_s=self.config.max_gap_s,
            max_backlog_lines=self.config.max_backlog_lines,
            writer=self.writer,
            clock=self.clock,
            on_unauthorized=self.refresh,
            ca_file=self.config.ca_file or None,
            timeout_s=self.config.timeout_s,
        )
        for note in self.pusher.notes:
            log.warning("NADIKI: %s", note)
        return registration

    def refresh(self) -> TimeSeriesConfig | None:
        """Ask the registrar for the server's current time-series config (after the endpoint refused the token)."""
        if self.registration is None:
            return None
        try:
            registration, _ = ensure_registration(
                self.client, self.description(), self.config.state_file, clock=self.wall
            )
        except RegistrationFailed as err:
            log.error("NADIKI: refreshing the time-series config failed: %s", err)
            return None
        refused = self._endpoint_problem(registration.time_series)
        if refused:
            log.error("NADIKI: refreshing the time-series config: %s; the previous one stays in use", refused)
            return None
        self.registration = registration
        return registration.time_series

    @property
    def server_id(self) -> str | None:
        return self.registration.server_id if self.registration else None

    def run(self, samples: Iterable[CounterSample], stop: threading.Event | None = None) -> None:
        if self.pusher is None:
            self.register()
        assert self.pusher is not None
        self.pusher.run(samples, stop)


__all__ = ["NODE_LABEL", "Provider", "counter_samples", "samples_from_snapshots"]
