"""Wiring of the running agent: sources → sampler → published snapshot → HTTP, recording.

:func:`build_agent` opens everything a configuration names (and logs what it found, what is
absent and what failed, in one message); :meth:`Agent.run` samples every ``interval_seconds``
until stopped, publishes a snapshot for ``/metrics`` at most once per second, and appends every
sample to the recording when one is configured.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from joulesched.contracts.runtime import BuildInfoCollector
from joulesched.measurement.clock import SteadyClock, wall_clock
from joulesched.measurement.config import AgentConfig, is_loopback, parse_listen
from joulesched.measurement.errors import MeasurementError
from joulesched.measurement.exporters.prometheus import SiteFactors, make_registry
from joulesched.measurement.exporters.record import RecordingWriter
from joulesched.measurement.meter import Pending
from joulesched.measurement.nadiki import CounterSample, Provider, counter_samples
from joulesched.measurement.sampler import Sampler
from joulesched.measurement.server import AgentServer
from joulesched.measurement.snapshot import Snapshot
from joulesched.measurement.sources.base import HasModel, HasNotes
from joulesched.measurement.sources.cgroup_cpu import CgroupCpu
from joulesched.measurement.sources.kube_pods import PodDirectory, open_directory
from joulesched.measurement.sources.procfs_stat import ProcStat
from joulesched.measurement.sources.registry import OpenedSources, open_sources, retry_openers
from joulesched.policy.errors import ConfigError
from joulesched.policy.site import NoIntensity

log = logging.getLogger(__name__)

PUBLISH_MIN_SECONDS = 1.0


@dataclass
class Agent:
    config: AgentConfig
    sampler: Sampler
    opened: OpenedSources
    directory: PodDirectory
    clock: Callable[[], float] = time.time
    recorder: RecordingWriter | None = None
    published: Snapshot | None = None
    provider: Provider | None = None
    site: SiteFactors | None = None
    stop_event: threading.Event = field(default_factory=threading.Event)
    _last_publish: float = float("-inf")
    # The provider's push loop reads counter samples from here; bounded, so a registrar that
    # stays down costs memory only up to the pusher's own backlog (it drops the oldest).
    _provider_queue: queue.Queue[list[CounterSample]] = field(default_factory=lambda: queue.Queue(maxsize=600))

    def step(self) -> Snapshot:
        """One sample: read, publish when a second has passed, record."""
        snap = self.sampler.sample()
        if snap.time - self._last_publish >= PUBLISH_MIN_SECONDS * 0.999 or self.published is None:
            self.published = snap
            self._last_publish = snap.time
        if self.recorder is not None:
            self.recorder.write(snap)
        if self.provider is not None:
            try:
                self._provider_queue.put_nowait(counter_samples(snap))
            except queue.Full:  # the push loop is stuck (registrar down): its windows resume later
                pass
        return snap

    def latest_published(self) -> Snapshot | None:
        return self.published

    def run(self) -> None:
        interval = self.config.interval_seconds
        # each source reads in a thread of its own from now on: a BMC that does not answer delays
        # neither the other sources nor the HTTP endpoints
        self.sampler.meter.start(self.config.sources.read_wait_seconds)
        refresher = threading.Thread(target=self._refresh_pods, name="pod-names", daemon=True)
        refresher.start()
        if self.provider is not None:
            threading.Thread(target=self._provide, name="nadiki", daemon=True).start()
        deadline = time.monotonic()
        while not self.stop_event.is_set():
            try:
                self.step()
            except Exception:  # a bug in one sample must not end the agent
                log.exception("sample failed")
            deadline += interval
            delay = deadline - time.monotonic()
            if delay < 0:  # fell behind (suspended, overloaded): skip, do not burst
                deadline = time.monotonic()
                delay = 0
            self.stop_event.wait(delay)
        if self.recorder is not None:
            self.recorder.close()

    def _refresh_pods(self) -> None:
        while not self.stop_event.is_set():
            self.directory.refresh()
            self.stop_event.wait(self.config.kubernetes.refresh_seconds)

    def _provider_samples(self) -> Iterator[CounterSample]:
        while not self.stop_event.is_set():
            try:
                yield from self._provider_queue.get(timeout=0.5)
            except queue.Empty:
                continue

    def _provide(self, retry_seconds: float = 60.0) -> None:
        """NADIKI provider mode: register (retrying while the registrar fails), then push."""
        assert self.provider is not None
        while not self.stop_event.is_set():
            try:
                self.provider.register()
                break
            except MeasurementError as err:
                log.error("NADIKI: registration failed, retrying in %g s: %s", retry_seconds, err)
                self.stop_event.wait(retry_seconds)
        else:
            return
        self.provider.run(self._provider_samples(), self.stop_event)

    def stop(self) -> None:
        self.stop_event.set()
        self.sampler.meter.stop()


def build_agent(config: AgentConfig, clock: Callable[[], float] | None = None) -> Agent:
    """The agent a configuration names, on ``clock`` (default: a :class:`SteadyClock`; every
    source, the sampler and the server stamp with it)."""
    clock = clock or SteadyClock()
    node = config.node.name or socket.gethostname()
    opened = open_sources(config.sources.order, config.sources.options, config.roots, clock)
    log.info("energy sources: %s", opened.message())
    for source in opened.sources:
        if isinstance(source, HasNotes):
            for note in source.notes:
                log.info("%s: %s", source.name, note)
    pending = [
        Pending(n, opener, message, group)
        for n, opener, message, group in retry_openers(opened, config.sources.options, config.roots, clock)
    ]
    if not opened.sources:
        log.error(
            "no energy source is usable; the agent reports CPU time only%s. %s",
            " and keeps trying " + ", ".join(p.name for p in pending) if pending else "",
            opened.message(),
        )
    elif pending:
        log.warning("sources that failed to open are tried again with backoff: %s", ", ".join(p.name for p in pending))
    cgroups = procstat = None
    try:
        cgroups = CgroupCpu(config.roots.cgroup)
        log.info("pods: %s", cgroups.describe())
    except MeasurementError as err:
        log.warning("per-pod CPU time unavailable: %s", err)
    try:
        procstat = ProcStat(config.roots.procfs)
    except MeasurementError as err:
        log.warning("node CPU time unavailable: %s", err)
    directory = open_directory(config.kubernetes.mode, node, config.kubernetes.kubeconfig)
    sampler = Sampler(
        config,
        opened.sources,
        node=node,
        clock=clock,
        cgroups=cgroups,
        procstat=procstat,
        pods=directory,
        pending=pending,
    )
    provider = None
    if config.nadiki is not None:
        gpu_models = [z.model for src in opened.sources for z in src.zones() if isinstance(z, HasModel) and z.model]
        provider = Provider(config.nadiki, config.roots, gpu_models=gpu_models, clock=clock, wall=wall_clock(clock))
        log.info("NADIKI provider mode: registrar %s", config.nadiki.registrar_url)
    site = None
    if config.site_file:
        from joulesched.contracts.sitefile import load_site_file

        catalogue = load_site_file(config.site_file)  # ConfigError names the file and field
        if config.node.site and config.node.site not in catalogue.sites:
            raise ConfigError(
                config.site_file,
                [f"node.site {config.node.site!r} is not a site of this file ({', '.join(catalogue.sites)})"],
            )
        site = SiteFactors(catalogue, config.node.site, config.node.server_id, node, wall_clock(clock))
        mine = catalogue.sites.get(config.node.site)
        if mine is not None and isinstance(mine.carbon, NoIntensity):
            log.warning("site %s: no carbon intensity given in %s: no intensity gauge (unknown, not 0 g/kWh)", mine.name, config.site_file)
    recorder = _open_recording(config.record_file) if config.record_file else None  # last: it truncates the file
    return Agent(config, sampler, opened, directory, clock, recorder, provider=provider, site=site)


def _open_recording(path: str) -> RecordingWriter:
    """The ``--record`` file (``record.file``), opened now: one that cannot be is refused before serving."""
    try:
        return RecordingWriter(path)
    except OSError as err:
        raise MeasurementError(f"record.file: cannot open {path}: {err.strerror or err}") from err


def read_token(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        token = f.read().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


def build_server(agent: Agent) -> AgentServer:
    host, port = parse_listen(agent.config.server.listen)
    token = read_token(agent.config.server.token_file) if agent.config.server.token_file else None
    loopback = is_loopback(host)
    registry = make_registry(agent.latest_published, agent.site)
    registry.register(BuildInfoCollector())
    if token is None and not loopback:
        log.warning(
            "listening on %s without server.token_file: the windows API is disabled (metrics and profile are served)",
            host,
        )
    return AgentServer(
        (host, port),
        sampler=agent.sampler,
        published=agent.latest_published,
        registry=registry,
        token=token,
        windows_allowed=token is not None or loopback,
        min_samples=agent.config.model.min_samples,
        stale_after=max(3 * agent.config.interval_seconds, 5.0),
        clock=agent.clock,
    )


__all__ = ["PUBLISH_MIN_SECONDS", "Agent", "build_agent", "build_server", "read_token"]
