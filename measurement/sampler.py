"""The sampler: one read of everything per interval, turned into a frozen :class:`Snapshot`.

Each :meth:`Sampler.sample` call (driven by the agent's loop, or by the simulator with its own
clock) reads every energy zone through the :class:`~measurement.meter.EnergyMeter`, the pods'
cgroup CPU time, ``/proc/stat`` and the GPUs' per-process use; differences them against the
previous sample; splits the node's energy into domains (:func:`measurement.energy.split_node`);
attributes it to pods (:func:`measurement.attribution.attribute`); updates the power model and
the cross-check; and returns a new snapshot. Nothing in a snapshot changes after it is built.

Gaps the meter cannot measure (a power gap longer than ``anomaly.max_gap_seconds``, a counter
reset or step back) are estimated here (:meth:`Sampler._estimate`): each zone has its own power
model P = a + b·u (u = busy cores), fitted on the intervals it measured cleanly, and a gap's energy
is a·seconds + b·(busy CPU seconds measured over the gap). A GPU zone, or a zone whose load never
varied, takes its mean power instead; a zone with fewer than ``model.min_samples`` clean intervals
gets no estimate (its gap stays discarded). Estimates are exported apart from measurements.

Windows (``POST/DELETE /v1/windows``, ``joulesched measure``) read the meter at their exact edges
through :meth:`Sampler.open_window` / :meth:`Sampler.close_window`: a window's energy is the
difference of two counter reads, never power × interval.
"""

from __future__ import annotations

import logging
import secrets
import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from joulesched.measurement.clock import SteadyClock, clock_step
from joulesched.measurement.config import AgentConfig
from joulesched.measurement.errors import TooManyWindows, UnknownWindow
from joulesched.measurement.meter import EnergyMeter, MeterRead, Pending
from joulesched.measurement.model import RollingFit
from joulesched.measurement.snapshot import GpuSummary, Interval, ModelSnapshot, PodSnapshot, Snapshot, ZoneSnapshot
from joulesched.measurement.sources.base import (
    ReportsPowerLimits,
    ReportsProcessUtilisation,
    ReportsUtilisation,
    Source,
)
from joulesched.measurement.sources.cgroup_cpu import CgroupCpu, PodCgroup
from joulesched.measurement.sources.kube_pods import NoDirectory, PodDirectory, PodMeta
from joulesched.measurement.sources.procfs_stat import CpuTimes, ProcStat, pod_uid_of_pid
from joulesched.measurement.windowstore import Saved, WindowStore, parse_record, shift_restarted, window_record
from joulesched.policy.attribution import PodUsage, attribute
from joulesched.policy.energy import (
    NANO,
    NODE_DOMAINS,
    Layout,
    ZoneInfo,
    ZoneKey,
    counter_delta,
    split_node,
    to_nanojoules,
)

log = logging.getLogger(__name__)

Clock = Callable[[], float]
OWNER_WINDOW_SECONDS = 300.0
MAX_WINDOWS = 1024
CPU_HISTORY = 7200  # samples of cumulative busy CPU time kept for estimating gaps (2 h at 1 s)
GPU_UTIL_WARN_SECONDS = 600.0  # a GPU utilisation query that keeps failing is warned of again this often


class _Pod:
    __slots__ = ("cgroup", "cpu_last", "cpu_total", "energy", "last_seen", "meta", "present")

    def __init__(self, cgroup: PodCgroup, cpu: float, now: float) -> None:
        self.cgroup = cgroup
        self.cpu_last = cpu
        self.cpu_total = 0.0
        self.energy = dict.fromkeys(NODE_DOMAINS, 0.0)
        self.last_seen = now
        self.present = True
        self.meta: PodMeta | None = None  # its names as the pod directory last listed them


@dataclass(frozen=True)
class Window:
    id: str
    start: MeterRead
    label: str
    restarted: Mapping[str, Any] | None = None  # opened before an agent restart: what it carried, what it lost
    kept: bool = True  # saved to server.state_dir, to be carried over a restart


class Sampler:
    def __init__(
        self,
        config: AgentConfig,
        sources: Sequence[Source],
        *,
        node: str,
        clock: Clock | None = None,
        cgroups: CgroupCpu | None = None,
        procstat: ProcStat | None = None,
        pods: PodDirectory | None = None,
        pending: Sequence[Pending] = (),
    ) -> None:
        self.config = config
        self.node = node
        clock = self.clock = clock or SteadyClock()
        sc = config.sources
        self.meter = EnergyMeter(
            sources,
            order=sc.order,
            clock=clock,
            max_zone_watts=config.anomaly.max_zone_watts,
            max_gap_seconds=max_gap_seconds(config),
            rescan_seconds=sc.rescan_seconds,
            server_includes_gpus=sc.server_includes_gpus,
            pending=pending,
            retry_initial_seconds=sc.retry_initial_seconds,
            retry_max_seconds=sc.retry_max_seconds,
            power_window_seconds=sc.power_window_seconds,
            stale_seconds=stale_seconds(config),
        )
        self._node_history: deque[tuple[float, float, str]] = deque()  # (time, node joules, basis): the gauge
        # for estimating gaps; own lock: the meter calls _estimate from a reader thread holding its lock
        self._cpu_lock = threading.Lock()
        self._cpu_history: deque[tuple[float, float]] = deque(maxlen=CPU_HISTORY)  # (time, busy s total)
        self._zone_models: dict[ZoneKey, RollingFit] = {}
        self._learned_at: dict[ZoneKey, float] = {}  # a power zone's last reading a model learned from
        self.meter.estimator = self._estimate
        self._store = WindowStore(config.server.state_dir, self.step) if config.server.state_dir else None
        self._store_lock = threading.Lock()
        self._restoring = self._store.load() if self._store is not None else None
        self._started = clock()
        self.cgroups = cgroups
        self.procstat = procstat
        self.directory: PodDirectory = pods or NoDirectory()
        self.lock = threading.RLock()
        self.latest: Snapshot | None = None
        self._seq = 0
        self._prev: MeterRead | None = None
        self._prev_busy: float | None = None
        self._cpus = 1
        self._pods: dict[str, _Pod] = {}
        self._pod_cgroups: list[PodCgroup] = []
        self._by_uid: dict[str, PodCgroup] = {}
        self._last_cgroup_scan = float("-inf")
        self._last_full_scan = float("-inf")
        self._pid_pods: dict[int, str | None] = {}
        self._busy_total = 0.0
        self._busy_ahead = 0.0  # busy seconds counted from the pods' CPU time while /proc/stat failed
        self._busy_fell_back = False  # a /proc/stat read failed since the last good difference
        self._node_total: dict[str, float] = {}
        self._domain_total = dict.fromkeys(NODE_DOMAINS, 0.0)
        # parts' energy (RAPL, GPUs) the server reading has not covered yet: split_node's owed
        self._owed: dict[ZoneKey, float] = {}
        self._owed_basis = ""
        self._buckets_total = {b: dict.fromkeys(NODE_DOMAINS, 0.0) for b in ("idle", "system")}
        m = config.model
        self.cpu_model = RollingFit(m.window_samples, m.min_samples, m.min_spread_cores)
        self.gpu_models: dict[str, RollingFit] = {}
        self._gpu_util: dict[str, float | None] = {}  # None: not measured this interval
        self._gpu_util_failing: dict[str, tuple[str, float, int]] = {}  # query -> (message, warned at, failures since)
        self._cross: deque[tuple[float, float | None, dict[str, float]]] = deque()
        self._ratio_ref: dict[str, float] = {}
        self._drifting: set[str] = set()
        self._owners: deque[tuple[float, dict[tuple[str, str, str], tuple[float, int]]]] = deque()
        self._windows: dict[str, Window] = {}
        self._healthy_before = False

    # -- windows -------------------------------------------------------------------------------

    # The meter is read outside the sampler's lock: a window edge waits for the sources at most
    # sources.read_wait_seconds, never for a sample in progress.

    def open_window(self, label: str = "", keep: bool = True) -> Window:
        """A window from now; ``keep``: saved to ``server.state_dir`` and carried over a restart
        (a Nextflow run's is not: its run is not kept either, and nothing would close it)."""
        with self.lock:
            if len(self._windows) >= MAX_WINDOWS:
                raise TooManyWindows(f"{MAX_WINDOWS} windows are open; close some first")
        start = self.meter.read()
        with self.lock:
            if len(self._windows) >= MAX_WINDOWS:
                raise TooManyWindows(f"{MAX_WINDOWS} windows are open; close some first")
            window = Window(secrets.token_hex(8), start, label, kept=keep)
            self._windows[window.id] = window
        self._persist()
        return window

    def window(self, window_id: str) -> Window:
        self._restore_now()
        with self.lock:
            if window_id not in self._windows:
                raise UnknownWindow(window_id)
            return self._windows[window_id]

    def close_window(self, window_id: str) -> dict[str, Any]:
        self._restore_now()
        with self.lock:
            window = self._windows.pop(window_id, None)
            if window is None:
                raise UnknownWindow(window_id)
        end = self.meter.read()
        self._persist()
        return window_energy(
            window.start, end, self.meter.layout, window.id, window.label, window.restarted, self.step()
        )

    def step(self) -> float:
        """How far the system clock has been stepped since the sampler's clock started
        (measurement/clock.py): a stamp plus this is wall time."""
        return clock_step(self.clock)

    # -- windows across a restart (measurement/windowstore.py) --------------------------------

    def _persist(self) -> None:
        if self._store is None:
            return
        if self._restoring is not None:
            # The last run's windows wait for their zones' first readings (_restore_due), in the
            # file and in the last run's terms: a save now would write the windows open in this
            # run without them. Once they are carried over, every window is saved.
            return
        with self.lock:
            records = [
                window_record(w.id, w.label, w.start.time, w.start.totals, w.start.estimated, w.restarted)
                for w in self._windows.values()
                if w.kept
            ]
        read = self.meter.current()
        with self._store_lock:
            self._store.save(records, self.meter.anchors(), read.time, read.totals, read.estimated)

    def _restore_now(self) -> None:
        """A request for a window of the last run before the first samples: carry them now."""
        if self._restoring is not None:
            self._restore(self.meter.read())

    def _restore(self, read: MeterRead) -> None:
        with self.lock:
            if self._restoring is None:
                return
            last = self._restoring
            records, old, saved = last.windows, last.anchors, last.saved
            self._restoring = None
            new = self.meter.anchors()
            offsets: dict[ZoneKey, tuple[int, int]] = {}  # old-frame total - new-frame total (all, estimated)
            for key, a in old.items():
                b = new.get(key)
                if b is None:
                    continue
                delta = counter_delta(a.raw, b.raw, a.max_joules, b.time - a.time, self.config.anomaly.max_zone_watts)
                if delta.joules is not None:
                    offsets[key] = (
                        a.total_nj + to_nanojoules(delta.joules) - b.total_nj,
                        a.estimated_nj - b.estimated_nj,
                    )
            carried = 0
            for record in records:
                try:
                    window = self._carried(record, read, last, offsets, saved)
                except (ValueError, TypeError, KeyError, AttributeError) as err:  # one record, that window only
                    log.error("window %s of the last run is lost: its record in %s is unreadable: %s",
                              record.get("id"), self._store.path if self._store else "?", err)  # fmt: skip
                    continue
                self._windows[window.id] = window
                carried += 1
            if carried:
                log.info(
                    "%d window%s of the last run carried over the restart",
                    carried,
                    "" if carried == 1 else "s",
                )
        self._persist()

    def _carried(
        self,
        record: Mapping[str, Any],
        read: MeterRead,
        last: Saved,
        offsets: Mapping[ZoneKey, tuple[int, int]],
        saved: float,
    ) -> Window:
        """One window of the last run, carried into this run's totals (see _restore)."""
        totals, estimated = parse_record(record)
        start_totals: dict[ZoneKey, int] = {}
        start_estimated: dict[ZoneKey, int] = {}
        lost: list[str] = []
        for key, now_total in read.totals.items():
            if key in totals and key in offsets:
                start_totals[key] = totals[key] - offsets[key][0]
                start_estimated[key] = estimated.get(key, 0) - offsets[key][1]
            elif key in totals and key in last.totals:  # keep its energy up to the save
                start_totals[key] = now_total - (last.totals[key] - totals[key])
                start_estimated[key] = read.estimated.get(key, 0) - (
                    last.estimated.get(key, 0) - estimated.get(key, 0)
                )
                lost.append(f"{key[0]}/{key[1]}")
            else:
                start_totals[key] = now_total
                start_estimated[key] = read.estimated.get(key, 0)
                if key in totals:
                    lost.append(f"{key[0]}/{key[1]}")
        lost = sorted(lost + [f"{k[0]}/{k[1]}" for k in totals.keys() - read.totals.keys()])
        earlier = record.get("restarted")
        before: Mapping[str, Any] = earlier if isinstance(earlier, Mapping) else {}
        restarted = {  # this restart's, and what earlier ones lost
            "at": read.time,
            "last_saved": saved,
            "zones_lost": sorted(set(lost) | set(before.get("zones_lost") or ())),
            "seconds_lost": (read.time - saved if lost else 0.0) + float(before.get("seconds_lost") or 0.0),
            "restarts": int(before.get("restarts") or 1) + 1 if before else 1,
        }
        window = Window(
            record["id"],
            MeterRead(float(record["start"]), start_totals, start_estimated),
            str(record.get("label", "")),
            restarted,
        )
        return window

    def _restore_due(self, read: MeterRead) -> bool:
        """Carry the last run's windows once every zone it anchored has been read again (a slow BMC's
        first reading can come a few samples late), or after 30 s."""
        assert self._restoring is not None
        old = self._restoring.anchors
        new = self.meter.anchors()
        waiting = [k for k in old if k in read.totals and k not in new]
        return not waiting or read.time - self._started >= 30.0

    # -- sampling ------------------------------------------------------------------------------

    def sample(self) -> Snapshot:
        read = self.meter.read()
        if self._restoring is not None and self._restore_due(read):
            self._restore(read)
        with self.lock:
            snapshot = self._sample(read)
            keep = bool(self._windows)
        if keep:
            self._persist()  # the counters' anchors move on: a restart now carries the windows from here
        return snapshot

    def _read_cpu(self, now: float) -> tuple[CpuTimes | None, dict[str, float]]:
        times = None
        if self.procstat is not None:
            try:
                times = self.procstat.read()
                self._cpus = times.cpus
            except Exception as err:
                log.warning("node CPU time unavailable: %s", err)
        usage: dict[str, float] = {}
        if self.cgroups is not None:
            # Pods are re-listed every cgroup_rescan_seconds when the listing changed, and fully
            # (requests can change in place) every sources.rescan_seconds.
            full = now - self._last_full_scan >= self.config.sources.rescan_seconds
            if full or now - self._last_cgroup_scan >= self.config.attribution.cgroup_rescan_seconds:
                self._last_cgroup_scan = now
                if self.cgroups.changed() or full:
                    self._last_full_scan = now
                    self._pod_cgroups = self.cgroups.scan()
                    self._by_uid = {c.uid: c for c in self._pod_cgroups}
                    for uid, cgroup in self._by_uid.items():  # requests may have changed in place
                        if uid in self._pods:
                            self._pods[uid].cgroup = cgroup
                    self._pid_pods.clear()
            usage = self.cgroups.read(self._pod_cgroups)
        return times, usage

    def _gpu_use(self) -> tuple[dict[str, dict[str, float]], dict[str, float], dict[str, float]]:
        """Per pod and per GPU SM use, the use of non-pod processes, and each GPU's utilisation."""
        per_pod: dict[str, dict[str, float]] = {}
        other: dict[str, float] = {}
        util: dict[str, float] = {}  # only the GPUs whose utilisation was measured: the others are unknown, not idle
        for source in self.meter.source_objects:
            if isinstance(source, ReportsProcessUtilisation):
                try:
                    processes: Mapping[int, Mapping[str, float]] = source.process_utilisation()
                except Exception as err:
                    self._gpu_util_failed(f"{source.name} per-process GPU use", err)
                    processes = {}
                else:
                    self._gpu_util_ok(f"{source.name} per-process GPU use")
                    # with per-process use known, a GPU no process touches is idle (0), not unknown
                    for zone in source.zones():
                        if zone.domain == "gpu":
                            util.setdefault(zone.name, 0.0)
                for pid, gpus in processes.items():
                    if pid not in self._pid_pods:
                        self._pid_pods[pid] = pod_uid_of_pid(self.config.roots.procfs, pid)
                    uid = self._pid_pods[pid]
                    for gpu, fraction in gpus.items():
                        if uid is None:
                            other[gpu] = other.get(gpu, 0.0) + fraction
                        else:
                            per_pod.setdefault(uid, {})
                            per_pod[uid][gpu] = per_pod[uid].get(gpu, 0.0) + fraction
                        util[gpu] = min(util.get(gpu, 0.0) + fraction, 1.0)
            if isinstance(source, ReportsUtilisation):
                try:
                    util.update({str(k): float(v) for k, v in source.utilisation().items()})
                except Exception as err:
                    self._gpu_util_failed(f"{source.name} GPU utilisation", err)
                else:
                    self._gpu_util_ok(f"{source.name} GPU utilisation")
        return per_pod, other, util

    def _gpu_util_failed(self, query: str, err: Exception) -> None:
        """A warning when the query starts failing or its error changes, then at most once every
        ``GPU_UTIL_WARN_SECONDS`` while it goes on (with how many failed since): the GPUs'
        utilisation is absent meanwhile, and someone should know why."""
        message = str(err) or type(err).__name__
        now = self.clock()
        last = self._gpu_util_failing.get(query)
        if last is None or last[0] != message or now - last[1] >= GPU_UTIL_WARN_SECONDS:
            again = f" ({last[2] + 1} failures since the last warning)" if last is not None and last[0] == message else ""
            log.warning("%s unavailable, GPU utilisation not exported meanwhile: %s%s", query, message, again)
            self._gpu_util_failing[query] = (message, now, 0)
        else:
            self._gpu_util_failing[query] = (message, last[1], last[2] + 1)
            log.debug("%s unavailable: %s", query, message)

    def _gpu_util_ok(self, query: str) -> None:
        if self._gpu_util_failing.pop(query, None) is not None:
            log.info("%s available again", query)

    def _sample(self, read: MeterRead) -> Snapshot:
        now = read.time
        times, usage = self._read_cpu(now)
        gpu_per_pod, gpu_other, gpu_util = self._gpu_use()
        # The model learns only from intervals whose both edges read every source: a failed read
        # shows as 0 W and the catch-up after it as double power.
        healthy = self.meter.all_up()
        learn, self._healthy_before = healthy and self._healthy_before, healthy
        layout = self.meter.layout
        prev = self._prev
        interval: Interval | None = None
        dt = now - prev.time if prev is not None else 0.0

        # -- pods: baseline new ones, difference known ones, mark vanished ones --------------
        by_uid = self._by_uid
        pods = self._pods
        pod_cpu: dict[str, float] = {}
        for uid, seconds in usage.items():
            pod = pods.get(uid)
            if pod is None or not pod.present:
                cgroup = by_uid.get(uid)
                if cgroup is None:
                    continue
                if pod is None:
                    pods[uid] = _Pod(cgroup, seconds, now)
                else:
                    pod.present, pod.cpu_last, pod.last_seen, pod.cgroup = True, seconds, now, cgroup
                continue
            delta = seconds - pod.cpu_last
            pod.cpu_last = seconds
            pod.last_seen = now
            if delta >= 0:
                pod_cpu[uid] = delta
        if len(pods) != len(usage):
            retention = self.config.attribution.pod_retention_seconds
            for uid in pods.keys() - usage.keys():
                pod = pods[uid]
                pod.present = False
                if now - pod.last_seen > retention:
                    del pods[uid]

        busy = 0.0
        # this interval's busy time is one plain /proc/stat difference (or, with no /proc/stat
        # configured, the pods' CPU time by design)
        busy_measured = self.procstat is None
        if times is not None and self._prev_busy is not None:
            busy = max(times.busy_seconds - self._prev_busy, 0.0)
            if self._busy_fell_back:  # this difference spans the failed reads' intervals too
                caught = min(busy, self._busy_ahead)  # the fallback counted for them: not twice
                busy -= caught
                self._busy_ahead -= caught
                self._busy_fell_back = self._busy_ahead > 0  # (a remainder: taken off the next ones)
                # not learnt from: part of this difference is those intervals' time
            else:
                busy_measured = True
        elif prev is not None:  # no /proc/stat difference for this interval: the pods' CPU time, the least it was
            busy = sum(pod_cpu.values())
            if times is None and self._prev_busy is not None:
                self._busy_ahead += busy  # the next good read's difference covers this interval again
                self._busy_fell_back = True  # (even when the pods used nothing: the difference spans it)
        if times is not None:
            self._prev_busy = times.busy_seconds
        if prev is not None:
            self._busy_total += busy
        with self._cpu_lock:
            self._cpu_history.append((now, self._busy_total))

        if prev is not None and dt > 0:
            deltas: dict[ZoneKey, float] = {k: (v - prev.totals.get(k, 0)) / NANO for k, v in read.totals.items()}
            estimated = {
                k: (v - prev.estimated.get(k, 0)) / NANO
                for k, v in read.estimated.items()
                if v != prev.estimated.get(k, 0)
            }
            # an estimate must not teach the models it came from, nor busy time that is not this interval's
            learn = learn and not estimated and busy_measured
            watts = self._model_watts(deltas, dt, prev.time, now) if learn else None
            if watts is not None:
                self._learn_zones(watts, busy / dt)
            owed = self._owed if self._owed_basis == layout.basis else None
            split = split_node(layout, deltas, owed)
            self._owed, self._owed_basis = self._carry(layout, split.unfitted, deltas, dt, now), layout.basis
            pods_now = self._pods
            usages = {
                uid: PodUsage(cpu, pods_now[uid].cgroup.requests_millicores or 0.0, gpu_per_pod[uid])
                if uid in gpu_per_pod
                else PodUsage(cpu, pods_now[uid].cgroup.requests_millicores or 0.0)
                for uid, cpu in pod_cpu.items()
            }
            for uid, use in gpu_per_pod.items():
                if uid not in pod_cpu:  # a pod not attributed this interval (its first): its use is system's
                    for gpu, fraction in use.items():
                        gpu_other[gpu] = gpu_other.get(gpu, 0.0) + fraction
            gpu_idle = {g: self._gpu_model(g).idle_estimate() for g in split.gpu_zones}
            result = attribute(
                split,
                dt,
                busy,
                usages,
                idle_watts=self.cpu_model.idle_estimate(),
                gpu_idle_watts=gpu_idle,
                gpu_other_use=gpu_other,
                policy=self.config.attribution.idle_policy,
            )
            for uid, domains in result.pods.items():
                pod = self._pods[uid]
                pod.cpu_total += pod_cpu[uid]
                for domain, joules in domains.items():
                    pod.energy[domain] = pod.energy.get(domain, 0.0) + joules
            for bucket, domains in result.buckets.items():
                for domain, joules in domains.items():
                    self._buckets_total[bucket][domain] += joules
            for domain, joules in split.domains.items():
                self._domain_total[domain] += joules
            if split.basis:
                self._node_total[split.basis] = self._node_total.get(split.basis, 0.0) + split.node_joules
            # the node's power as the models learn it: the same split of each zone's power
            # (split_node is linear), when every zone the node's figure is made of has a value of
            # its own for this interval (a whole-server source only cross-checked does not count)
            used = {layout.platform, layout.psys, layout.rapl, layout.gpu} - {None}
            known = {k: w for k, w in (watts or {}).items() if w is not None}
            if watts is not None and all(w is not None for k, w in watts.items() if k[0] in used):
                power = split_node(layout, known)
                if layout.platform or layout.rapl or layout.psys:
                    self.cpu_model.add(busy / dt, power.node_joules - power.domains.get("gpu", 0.0))
                for gpu, gpu_watts in power.gpu_zones.items():
                    if gpu in gpu_util:
                        self._gpu_model(gpu).add(gpu_util[gpu], gpu_watts)
            self._gpu_util = {g: gpu_util.get(g) for g in split.gpu_zones}
            self._cross_check(dt, split.rapl_joules, dict(split.platform_joules))
            self._track_owners(dt, pod_cpu)
            interval = Interval(
                start=prev.time,
                end=now,
                seconds=dt,
                basis=split.basis,
                node_joules=split.node_joules,
                domains=dict(split.domains),
                pods=result.pods,  # built fresh by attribute() and never changed afterwards
                buckets=result.buckets,
                busy_cpu_seconds=busy,
                pod_cpu_seconds=dict(pod_cpu),
                zones={f"{k[0]}/{k[1]}": j for k, j in deltas.items()},
                estimated_joules=split_node(layout, estimated).node_joules if estimated else 0.0,
            )
        elif prev is not None and dt <= 0:
            log.warning("clock did not advance between samples (%.6f → %.6f); interval skipped", prev.time, now)
        self._prev = read
        snapshot = self._build(read, interval, dt)
        self.latest = snapshot
        return snapshot

    def _carry(
        self, layout: Layout, unfitted: Mapping[ZoneKey, float], deltas: Mapping[ZoneKey, float], dt: float, now: float
    ) -> dict[ZoneKey, float]:
        """What of the parts' energy that did not fit inside the server reading is carried to the
        next interval: as much as each part drew while the server reading lags (since its last
        reading, at this interval's power), which its catch-up covers. Beyond that the server
        reading is believed, and the rest stays scaled away."""
        platform = layout.platform
        if not unfitted or not platform:
            return {}
        covered = self.meter.covered_until(platform)
        lag = now - covered if covered is not None else 0.0
        if lag <= 0:
            return {}
        carried = {key: min(j, max(deltas.get(key, 0.0), 0.0) / dt * lag) for key, j in unfitted.items()}
        return {key: j for key, j in carried.items() if j > 0}

    def _model_watts(
        self, deltas: Mapping[ZoneKey, float], dt: float, start: float, end: float
    ) -> dict[ZoneKey, float | None]:
        """Each zone's power in this interval as the models learn it.

        A counter's is its difference over the interval. A power zone's is its own reading (an
        instant, or the BMC's short average) taken within the interval, paired with the
        interval's CPU use as it is: the straight line the meter integrates between two readings
        would blur a load step over two intervals and bias the slope. None where a power zone
        has no reading of its own in the interval (a BMC refreshing slower than the interval):
        the meter's energy there is 0 until the next reading, then that reading's whole span, so
        an interval without a reading would teach 0 W and the next twice the power.
        """
        readings = self.meter.power_readings()
        # a reading taken in answer to this sample's request is stamped just after the request
        late = end + self.config.sources.read_wait_seconds
        watts: dict[ZoneKey, float | None] = {}
        for key, joules in deltas.items():
            reading = readings.get(key)
            if reading is None:
                watts[key] = joules / dt
            elif max(start, self._learned_at.get(key, start)) < reading.timestamp <= late:
                self._learned_at[key] = reading.timestamp
                watts[key] = reading.value
            else:
                watts[key] = None  # no reading of its own in this interval
        return watts

    def _learn_zones(self, watts: Mapping[ZoneKey, float | None], cores: float) -> None:
        """Teach each zone's model its power in this interval (:meth:`_model_watts`) against
        the busy cores."""
        m = self.config.model
        with self._cpu_lock:
            for key, value in watts.items():
                if value is None:
                    continue
                model = self._zone_models.get(key)
                if model is None:
                    model = self._zone_models[key] = RollingFit(m.window_samples, m.min_samples, m.min_spread_cores)
                model.add(cores, value)

    def _busy_between(self, start: float, end: float) -> float | None:
        """Busy CPU seconds measured between two moments: interpolated between samples, and at the
        recent end extrapolated at the last interval's rate (a reading can arrive before the
        sample that measures its CPU time)."""
        history = self._cpu_history
        if len(history) < 2:
            return None

        def at(t: float) -> float:
            if t >= history[-1][0]:
                (t0, b0), (t1, b1) = history[-2], history[-1]
            elif t <= history[0][0]:
                (t0, b0), (t1, b1) = history[0], history[1]
            else:
                i = bisect_right(history, t, key=lambda item: item[0])
                (t0, b0), (t1, b1) = history[i - 1], history[i]
            rate = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
            return b0 + rate * (t - t0)

        return max(at(end) - at(start), 0.0)

    def _estimate(self, info: ZoneInfo, start: float, end: float) -> float | None:
        """The energy of one zone over an interval it could not measure (None: no estimate)."""
        seconds = end - start
        with self._cpu_lock:
            model = self._zone_models.get((info.source, info.zone))
            if model is None or model.samples < model.min_samples:
                return None
            mean = model.mean_power()
            fit = model.fit() if info.domain != "gpu" else None
            busy = self._busy_between(start, end) if fit is not None else None
        if fit is None or busy is None:
            return max(mean, 0.0) * seconds if mean is not None else None
        return max(fit.idle_watts * seconds + fit.slope_watts * busy, 0.0)

    def _gpu_model(self, gpu: str) -> RollingFit:
        model = self.gpu_models.get(gpu)
        if model is None:
            m = self.config.model
            model = self.gpu_models[gpu] = RollingFit(m.window_samples, m.min_samples, m.min_spread_gpu)
        return model

    def _cross_check(self, dt: float, rapl: float | None, platform: dict[str, float]) -> None:
        window = self.config.cross_check.window_seconds
        self._cross.append((dt, rapl, platform))
        span = sum(item[0] for item in self._cross)
        while self._cross and span - self._cross[0][0] >= window:
            span -= self._cross.popleft()[0]

    def ratios(self) -> dict[str, float]:
        """Energy ratios over the cross-check window: RAPL (package + DRAM) over each whole-server
        source, and the second whole-server source over the first."""
        layout = self.meter.layout
        out: dict[str, float] = {}
        platforms = [p for p in (layout.platform, *layout.platform_others) if p]
        rapl_sum = sum(r for _, r, _ in self._cross if r is not None)
        sums = {p: sum(pl.get(p, 0.0) for _, _, pl in self._cross) for p in platforms}
        if layout.rapl:
            for p in platforms:
                if sums[p] > 0:
                    out[f"{layout.rapl}/{p}"] = rapl_sum / sums[p]
        if len(platforms) > 1 and sums[platforms[0]] > 0:
            for p in platforms[1:]:
                out[f"{p}/{platforms[0]}"] = sums[p] / sums[platforms[0]]
        return out

    def _check_drift(self, ratios: Mapping[str, float]) -> None:
        """Warn when a ratio drifts more than ``cross_check.drift`` from its reference: 1 for two
        whole-server sources, the ratio's long-run mean for RAPL over a whole-server source."""
        if sum(item[0] for item in self._cross) < self.config.cross_check.window_seconds * 0.999:
            return
        drift = self.config.cross_check.drift
        rapl = self.meter.layout.rapl
        for pair, ratio in ratios.items():
            same_thing = not (rapl and pair.startswith(rapl + "/"))
            ref = 1.0 if same_thing else self._ratio_ref.setdefault(pair, ratio)
            if not same_thing:  # slow mean: a time constant of ~60 windows
                self._ratio_ref[pair] = ref + (ratio - ref) / 60.0
            off = abs(ratio / ref - 1.0) if ref > 0 else 0.0
            if off > drift and pair not in self._drifting:
                self._drifting.add(pair)
                log.warning(
                    "sources %s disagree: ratio %.3f is %.1f %% off its reference %.3f (threshold %.1f %%)",
                    pair,
                    ratio,
                    off * 100,
                    ref,
                    drift * 100,
                )
            elif off <= drift * 0.8 and pair in self._drifting:
                self._drifting.discard(pair)
                log.info("sources %s agree again: ratio %.3f", pair, ratio)

    def _track_owners(self, dt: float, pod_cpu: Mapping[str, float]) -> None:
        per_owner: dict[tuple[str, str, str], tuple[float, int]] = {}
        if isinstance(self.directory, NoDirectory):
            pod_cpu = {}  # owners come from the API only
        for uid, cpu in pod_cpu.items():
            meta = self.directory.lookup(uid)
            if meta is None or not meta.owner:
                continue
            key = (meta.namespace, meta.owner_kind, meta.owner)
            seconds, count = per_owner.get(key, (0.0, 0))
            per_owner[key] = (seconds + cpu, count + 1)
        self._owners.append((dt, per_owner))
        span = sum(item[0] for item in self._owners)
        while self._owners and span - self._owners[0][0] >= OWNER_WINDOW_SECONDS:
            span -= self._owners.popleft()[0]

    def _owner_cores(self) -> tuple[tuple[str, str, str, float], ...]:
        cpu: dict[tuple[str, str, str], float] = {}
        pod_seconds: dict[tuple[str, str, str], float] = {}
        for dt, per_owner in self._owners:
            for key, (seconds, count) in per_owner.items():
                cpu[key] = cpu.get(key, 0.0) + seconds
                pod_seconds[key] = pod_seconds.get(key, 0.0) + dt * count
        return tuple(
            (ns, kind, owner, cpu[(ns, kind, owner)] / s)
            for (ns, kind, owner), s in sorted(pod_seconds.items())
            if s > 0
        )

    # -- the snapshot --------------------------------------------------------------------------

    def _build(self, read: MeterRead, interval: Interval | None, dt: float) -> Snapshot:
        zones = []
        for info, total_nj, present, watts, estimated_nj in self.meter.zone_states():
            zones.append(
                ZoneSnapshot(
                    info.source,
                    info.zone,
                    info.domain,
                    info.kind,
                    info.parent,
                    info.max_joules,
                    total_nj / NANO,
                    watts,
                    present,
                    estimated_nj / NANO,
                )
            )
        pods = []
        lookup = None if isinstance(self.directory, NoDirectory) else self.directory.lookup
        kept_names = False
        for uid, pod in sorted(self._pods.items()):
            cg = pod.cgroup
            meta = lookup(uid) if lookup is not None else None
            if meta is not None:
                pod.meta = meta
            elif pod.meta is not None:  # deleted from the API (retained), or the API not answering: its last names
                meta, kept_names = pod.meta, True
            if meta is None:  # positional: hundreds of these per interval
                pods.append(
                    PodSnapshot(
                        uid,
                        "",
                        uid,
                        cg.qos,
                        "",
                        "",
                        cg.requests_millicores,
                        pod.cpu_total,
                        pod.energy.copy(),
                        pod.present,
                    )
                )
            else:
                ident = (uid, meta.namespace, meta.name, cg.qos, meta.owner_kind, meta.owner)
                pods.append(PodSnapshot(*ident, cg.requests_millicores, pod.cpu_total, pod.energy.copy(), pod.present))
        if kept_names:
            pods = self._one_per_name(pods, lookup)
        models = []
        fit = self.cpu_model.fit()
        if fit is not None:
            models.append(ModelSnapshot("cpu", fit.idle_watts, fit.slope_watts, fit.r2, fit.samples))
        gpu_fits = {g: m.fit() for g, m in sorted(self.gpu_models.items())}
        for gpu, gfit in gpu_fits.items():
            if gfit is not None:
                models.append(ModelSnapshot(gpu, gfit.idle_watts, gfit.slope_watts, gfit.r2, gfit.samples))
        ratios = self.ratios()
        self._check_drift(ratios)
        # none measured before the first interval, nor over one the clock did not advance across:
        # the gauge is left out then (utilisation_measured), never exported as an idle node
        utilisation, utilisation_measured = 0.0, interval is not None and dt > 0
        if interval is not None and dt > 0:
            utilisation = min(max(interval.busy_cpu_seconds / (dt * self._cpus), 0.0), 1.0)
        layout = self.meter.layout
        self._seq += 1
        return Snapshot(
            node=self.node,
            seq=self._seq,
            time=read.time,
            interval_seconds=self.config.interval_seconds,
            idle_policy=self.config.attribution.idle_policy,
            cpus=self._cpus,
            utilisation=utilisation,
            utilisation_measured=utilisation_measured,
            basis=layout.basis,
            sources_used=layout.sources,
            zones=tuple(zones),
            sources=self.meter.source_snapshots(),
            node_energy_total=dict(self._node_total),
            node_power_watts=self._node_power(read, interval),
            domain_energy_total=dict(self._domain_total),
            buckets_total={b: dict(d) for b, d in self._buckets_total.items()},
            busy_cpu_seconds_total=self._busy_total,
            pods=tuple(pods),
            models=tuple(models),
            anomalies=tuple((s, z, k, c) for (s, z, k), c in sorted(self.meter.anomalies.items())),
            ratios=ratios,
            gpus=self._gpu_summary(gpu_fits),
            owners=self._owner_cores(),
            windows_open=len(self._windows),
            interval=interval,
            server_id=self.config.node.server_id,
            site=self.config.node.site,
            speed=self.config.node.speed,
            power_cap_watts=self.config.node.power_cap_watts,
            domains=layout.domains,
            discarded=tuple((s, z, k, sec) for (s, z, k), sec in sorted(self.meter.discarded_seconds.items())),
            estimated=tuple((s, z, k, sec) for (s, z, k), sec in sorted(self.meter.estimated_seconds.items())),
            clock_step=self.step(),
        )

    def _one_per_name(
        self, pods: list[PodSnapshot], lookup: Callable[[str], PodMeta | None] | None
    ) -> list[PodSnapshot]:
        """One pod per namespace and name (the pod series have no uid label): where a pod kept the
        name it had before the API dropped it and another pod of this node carries that name now
        (a StatefulSet's successor), the pod the API lists wins, then the one whose cgroup is
        present, then the one seen last. A loser whose cgroup is gone ends its retention now (its
        series goes on as the successor's, a counter reset); one still present is named by its
        UID from now on, as a pod the API does not list."""
        names = [(p.namespace, p.name) for p in pods]
        if len(set(names)) == len(names):  # no two alike: the usual case, checked every sample while one is kept
            return pods
        best: dict[tuple[str, str], tuple[tuple[bool, bool, float], str]] = {}
        for p, key in zip(pods, names, strict=True):
            rank = (lookup is not None and lookup(p.uid) is not None, p.present, self._pods[p.uid].last_seen)
            if key not in best or rank > best[key][0]:
                best[key] = (rank, p.uid)
        out = []
        for p, key in zip(pods, names, strict=True):
            if best[key][1] == p.uid:
                out.append(p)
                continue
            pod = self._pods[p.uid]
            log.debug("pod %s: its name %s/%s is another pod's now", p.uid, p.namespace, p.name)
            if not p.present:
                del self._pods[p.uid]
                continue
            pod.meta = None
            out.append(p._replace(namespace="", name=p.uid, owner_kind="", owner=""))
        return out

    def _node_power(self, read: MeterRead, interval: Interval | None) -> float | None:
        """The node's power over the last ``power_window_seconds`` of samples; None (absent, not
        0 W) while a zone of its basis is not reading, or before two samples."""
        history = self._node_history
        layout = self.meter.layout
        if interval is None or not layout.basis or not self.meter.basis_reading():
            history.clear()
            return None
        if history and history[0][2] != layout.basis:
            history.clear()
        total = self._node_total.get(layout.basis, 0.0)
        history.append((read.time, total, layout.basis))
        window = self.config.sources.power_window_seconds
        while len(history) > 2 and read.time - history[1][0] >= window:
            history.popleft()
        (t0, e0, _), (t1, e1, _) = history[0], history[-1]
        return (e1 - e0) / (t1 - t0) if t1 > t0 else None

    def _gpu_summary(self, fits: Mapping[str, Any]) -> GpuSummary | None:
        gpus = sorted(self._gpu_util)
        if not gpus:
            return None
        limits: dict[str, float] = {}
        for source in self.meter.source_objects:
            if isinstance(source, ReportsPowerLimits):
                try:
                    limits.update({str(k): float(v) for k, v in source.power_limits().items()})
                except Exception as err:
                    log.debug("%s: GPU power limits unavailable: %s", source.name, err)
        idle, peak = [], []
        for gpu in gpus:
            model = self._gpu_model(gpu)
            fit = fits.get(gpu)
            i = model.idle_estimate()
            idle.append(i)
            peak.append(limits.get(gpu) or (i + max(fit.slope_watts, 0.0) if fit is not None else i))
        n = len(gpus)
        measured = [u for u in self._gpu_util.values() if u is not None]
        if len(measured) < n:  # a GPU's utilisation unknown: so is the node's mean (left out, never 0)
            return GpuSummary(n, sum(idle) / n, max(sum(peak) / n, sum(idle) / n), 0.0, utilisation_measured=False)
        return GpuSummary(n, sum(idle) / n, max(sum(peak) / n, sum(idle) / n), sum(measured) / n)


def window_energy(
    start: MeterRead,
    end: MeterRead,
    layout: Any,
    window_id: str = "",
    label: str = "",
    restarted: Mapping[str, Any] | None = None,
    clock_step: float = 0.0,
) -> dict[str, Any]:
    """Energy per domain between two meter reads (a window's edges), as a JSON-ready mapping;
    its times are wall time: the reads' stamps plus ``clock_step`` (measurement/clock.py)."""
    deltas = {k: (v - start.totals[k]) / NANO for k, v in end.totals.items() if k in start.totals}
    layout = layout.covering(deltas.keys())  # a source that opened within the window has no energy for it
    split = split_node(layout, deltas)
    estimated = {
        k: (v - start.estimated.get(k, 0)) / NANO
        for k, v in end.estimated.items()
        if k in start.totals and v != start.estimated.get(k, 0)
    }
    return {
        "id": window_id,
        "label": label,
        "start": start.time + clock_step,
        "end": end.time + clock_step,
        "seconds": end.time - start.time,
        "basis": split.basis,
        "sources": list(layout.sources),
        "joules": {"node": split.node_joules, **{d: split.domains[d] for d in NODE_DOMAINS}},
        "zones": {f"{k[0]}/{k[1]}": j for k, j in sorted(deltas.items())},
        # the part of joules the agent estimated for gaps it could not measure (included above)
        "estimated_joules": {
            "node": split_node(layout, estimated).node_joules if estimated else 0.0,
            "zones": {f"{k[0]}/{k[1]}": j for k, j in sorted(estimated.items())},
        },
        **(
            {"restarted": shift_restarted(restarted, clock_step)}
            if restarted is not None
            else {}
        ),
    }


def max_gap_seconds(config: AgentConfig) -> float:
    """Power readings further apart than this are a gap (estimated, not integrated): more than one
    missed read at the configured interval, unless configured."""
    configured = config.anomaly.max_gap_seconds
    return configured if configured is not None else 2.5 * config.interval_seconds


def stale_seconds(config: AgentConfig) -> float:
    """How long a zone may go unread before its power gauge is absent: two intervals, the wait
    for a reading, and a second of slack for a loaded machine."""
    return 2 * config.interval_seconds + config.sources.read_wait_seconds + 1.0


__all__ = ["Sampler", "UnknownWindow", "Window", "max_gap_seconds", "stale_seconds", "window_energy"]
