"""The discrete-event engine: pods arrive, kube-scheduler places them, they run, nodes draw power.

Events (a heap ordered by time, then kind, then insertion): a pod *arrives* (at its trace time,
or when the last of its parents finishes), *finishes*, a booted node becomes *ready*, an empty
node's *scale-down* timer fires, a recorded power *sample* applies. After each event the
scheduler pops pods from its active queue (priority, then arrival) and runs the pipeline of
:mod:`sim.kube` on the nodes that exist: filter from a rotating start index until
``num_feasible_nodes_to_find`` feasible nodes are found, extender filter, score (skipped when
one node is left), extender prioritize, select. A pod that fits nowhere waits in the
unschedulable set; it is retried as soon as a node it could fit on frees capacity or
becomes ready (kube-scheduler's queueing hints, without the back-off delay).

Between events every node's utilisation is constant, so its power (its curve at that
utilisation, plus its GPUs) is constant: energy is integrated exactly, and so is each node's
energy weighted by its site's intensity series (power × the series' exact integral); carbon is
``policy.impact``'s, from the facility energy and that energy-weighted intensity, as for a
measured pod.

Deterministic for a seed: the only randomness is the tie-break and the autoscaler's
``random`` expander, each drawn from a ``numpy.random.Generator`` of its own.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from joulesched.policy.efficiency import efficiency, priorities
from joulesched.policy.impact import facility_joules, operational_grams
from joulesched.policy.power import drawn_watts, gpu_watts
from joulesched.sim import kube
from joulesched.sim.cluster import ClusterSpec, Node, profile_document
from joulesched.sim.deferral import DeferralOutcome, Deferrer, Deferring, units_of
from joulesched.sim.extender import ClusterView, Extender, PodRequest
from joulesched.sim.model import PodSpec, Workload
from joulesched.sim.schedstate import SchedulingState, needs_of

# Event kinds, in the order they are handled at equal times.
FINISH, NODE_READY, SAMPLE, ARRIVE, SCALE_DOWN, DEFER = 0, 1, 2, 3, 4, 5
OFF, BOOTING, READY = 0, 1, 2


@dataclass(frozen=True)
class Profile:
    """One kube-scheduler profile: the NodeResourcesFit strategy and an optional extender."""

    name: str
    fit_strategy: str = "least"  # least | most
    extender: Extender | None = None
    extender_weight: int = 1
    defer: Deferring | None = None  # hold deferrable work for cleaner hours (sim.deferral)


@dataclass(frozen=True)
class EngineOptions:
    seed: int = 0
    percentage_of_nodes_to_score: int = kube.DEFAULT_PERCENTAGE_OF_NODES_TO_SCORE
    record_timeseries: bool = True  # cluster power and per-node utilisation over time
    record_segments: bool = False  # per-node power/usage steps (for attribution)
    progress: Callable[[float], None] | None = None  # called with the fraction of pods finished


@dataclass
class PodOutcome:
    node: np.ndarray  # int, -1: never scheduled
    created: np.ndarray  # when it entered the scheduling queue
    start: np.ndarray  # NaN: never scheduled
    end: np.ndarray


@dataclass
class SimResult:
    profile: str
    nodes: list[Node]
    end_time: float  # the last event
    energy_joules: np.ndarray  # per node, IT
    carbon_grams: np.ndarray  # per node, facility energy × grid intensity
    facility_joules: np.ndarray  # per node, IT × PUE
    on_seconds: np.ndarray  # per node, powered (booting or ready)
    pods: PodOutcome
    unscheduled: int
    decisions: int
    extender_calls: int
    scale_ups: int
    scale_downs: int
    wall_seconds: float
    power_times: list[float] = field(default_factory=list)  # cluster IT power steps
    power_watts: list[float] = field(default_factory=list)
    util_log: list[tuple[float, int, float]] = field(default_factory=list)  # (t, node, utilisation)
    segments: list[list[tuple[float, float, float, int]]] = field(
        default_factory=list
    )  # per node: (t, watts, usage, pods)
    feasible_seen: list[int] = field(default_factory=list)  # candidates the extender saw per decision
    deferral: DeferralOutcome | None = None  # the profile defers


class Engine:
    def __init__(
        self, cluster: ClusterSpec, workload: Workload, profile: Profile, options: EngineOptions | None = None
    ) -> None:
        self.cluster = cluster
        self.workload = workload
        self.profile = profile
        self.opt = options or EngineOptions()
        # Two streams: kube-scheduler's tie-breaks and cluster-autoscaler's expander. One shared
        # stream let a policy that breaks fewer ties (one node kept by filter) change which node
        # type the autoscaler boots later, which is no effect of the policy.
        self.tiebreak_rng = np.random.default_rng(self.opt.seed)
        self.expander_rng = np.random.default_rng([self.opt.seed, 1])
        self.nodes = cluster.nodes()
        self._init_nodes()
        self._init_pods(workload.pods)
        self._init_deferral()
        self._reset_view()

    def _reset_view(self) -> None:
        self.view_version = 0
        self._view_cache: ClusterView | None = None
        self._sites = list(self.cluster.sites.values())
        self._carbon_key: tuple[int, ...] = ()
        self._carbon_now: dict[str, float] = {}

    # -- set-up ---------------------------------------------------------------------------------

    def _init_nodes(self) -> None:
        c = self.cluster
        types = [c.node_types[n.type_index] for n in self.nodes]
        n = len(self.nodes)
        self.n_nodes = n
        self._not_ready = 0  # nodes that exist but are not Ready (booting)
        self.usage = np.zeros(n)  # busy cores
        self.gpu_busy = np.zeros(n)  # busy GPU-equivalents
        self.cores = np.array([t.cores for t in types], dtype=float)
        self.gpu_count = np.array([t.gpus.count for t in types], dtype=float)
        self.speed = np.array([t.speed for t in types], dtype=float)
        self.gpu_speed = np.array([t.gpus.speed for t in types], dtype=float)
        self.curves = [tuple(float(w) for w in t.power_curve_watts) for t in types]
        self.gpu_idle = [t.gpus.idle_watts for t in types]  # each GPU's
        self.gpu_max = [t.gpus.max_watts for t in types]
        self.site_of = [n.site for n in self.nodes]
        sites = list(c.sites)
        self.site_index = np.array([sites.index(s) for s in self.site_of])
        self.pue = [c.sites[s].pue for s in self.site_of]
        self.series = [c.sites[s].carbon for s in self.site_of]
        self.type_of = np.array([nd.type_index for nd in self.nodes])
        self.state = np.full(n, READY, dtype=np.int8)
        self.power = [self._power_of(i) for i in range(n)]
        self.last_t = [0.0] * n
        self.energy = [0.0] * n
        self.intensity_ws = [0.0] * n  # IT energy × the intensity it was drawn at: J·(g/kWh)
        self.on_seconds = [0.0] * n
        self.total_power = float(sum(self.power))
        self.idle_version = [0] * n
        self._existing = np.arange(n)
        self._existing_dirty = False
        self.next_start = 0
        self.names = [nd.name for nd in self.nodes]
        self.reserved: dict[int, list[float]] = {}
        self._model: dict[
            int, tuple[tuple[float, ...], float, float]
        ] = {}  # curves replaced by a recording  # booting node -> [cpu_m, mem, gpu, pods] promised to pending pods

    def _init_pods(self, pods: Sequence[PodSpec]) -> None:
        m = len(pods)
        self.pods = pods
        groups: dict[str, int] = {}
        self.p_group = [groups.setdefault(p.group, len(groups)) if p.group else -1 for p in pods]
        self.sched = SchedulingState(self.cluster, self.profile.fit_strategy, len(groups), self.nodes)
        self.p_needs = [needs_of(p, g) for p, g in zip(pods, self.p_group, strict=True)]
        self.p_cpu = np.array([nd.cpu for nd in self.p_needs], dtype=np.int64)
        self.p_mem = np.array([nd.mem for nd in self.p_needs], dtype=np.int64)
        self.p_gpu = np.array([nd.gpu for nd in self.p_needs], dtype=np.int64)
        self.p_usage = [float(p.cpu_usage) for p in pods]
        self.p_gpu_busy = [p.gpu_request * p.gpu_usage for p in pods]
        self.p_duration = [float(p.duration) for p in pods]
        self.p_priority = [p.priority for p in pods]
        self.p_priority_arr = np.array(self.p_priority, dtype=np.int64)
        # Retry by walking the queue (below) unless the extender can turn a pod away from a node
        # that fits it: only the power-cap filter does, and only on capped nodes.
        self._walk_retry = self.profile.extender is None or not any(
            nt.power_cap_watts is not None for nt in self.cluster.node_types
        )
        self.children: list[list[int]] = [[] for _ in range(m)]
        self.waiting = [len(p.parents) for p in pods]
        for i, p in enumerate(pods):
            for parent in p.parents:
                self.children[parent].append(i)
        self.outcome = PodOutcome(
            node=np.full(m, -1, dtype=np.int64),
            created=np.full(m, np.nan),
            start=np.full(m, np.nan),
            end=np.full(m, np.nan),
        )
        self._requests = [
            PodRequest(i, p.name, p.namespace, nd.cpu, nd.mem, nd.gpu)
            for i, (p, nd) in enumerate(zip(pods, self.p_needs, strict=True))
        ]

    def _init_deferral(self) -> None:
        how = self.profile.defer
        self.units = units_of(self.pods, self.cluster, how.margin) if how is not None else []
        self.deferrer = Deferrer(self.cluster, how) if how is not None else None
        self.held_roots = {r for u in self.units for r in u.roots}

    # -- power and energy -----------------------------------------------------------------------

    def _power_of(self, n: int) -> float:
        """What node ``n`` draws now: its curve at its utilisation (:func:`policy.power.drawn_watts`,
        which holds P(1) above u = 1), plus its GPUs' (:func:`policy.power.gpu_watts`; a node
        not Ready draws their idle power)."""
        state = self.state[n]
        if state == OFF:
            return 0.0
        cpu = drawn_watts(self.curves[n], self.usage[n] / self.cores[n] if state == READY else 0.0)
        busy = self.gpu_busy[n] if state == READY else 0.0
        return cpu + float(gpu_watts(self.gpu_count[n], self.gpu_idle[n], self.gpu_max[n], busy))

    def _advance(self, n: int, t: float) -> None:
        """Integrate node ``n`` from its last change to ``t`` at its (constant) power."""
        last = self.last_t[n]
        if t <= last:
            return
        p = self.power[n]
        if p > 0.0:
            self.energy[n] += p * (t - last)
            self.intensity_ws[n] += p * self.series[n].integral(last, t)
        if self.state[n] != OFF:  # powered (booting or ready), whatever it draws: a curve may start at 0 W
            self.on_seconds[n] += t - last
        self.last_t[n] = t

    def _repower(self, n: int, t: float) -> None:
        """Node ``n``'s state changed at ``t``: close its interval and take the new power."""
        self._advance(n, t)
        new = self._power_of(n)
        self.view_version += 1
        if new != self.power[n]:
            self.total_power += new - self.power[n]
            self.power[n] = new
            if self.opt.record_timeseries:
                self._log_power(t)
        if self.opt.record_timeseries:
            u = min(self.usage[n] / self.cores[n], 1.0) if self.state[n] == READY else 0.0
            self.util_log.append((t, n, u if self.state[n] != OFF else math.nan))
        if self.opt.record_segments:
            self.segments[n].append((t, new, self._busy(n), int(self.sched.npods[n])))

    def _busy(self, n: int) -> float:
        return float(self.usage[n]) if self.state[n] == READY else 0.0

    def _log_power(self, t: float) -> None:
        if self.power_times and self.power_times[-1] == t:
            self.power_watts[-1] = self.total_power
        else:
            self.power_times.append(t)
            self.power_watts.append(self.total_power)

    # -- the view the extender sees ------------------------------------------------------------

    def _view(self, t: float) -> ClusterView:
        if self._view_cache is not None and self._view_cache.version == self.view_version:
            return self._view_cache
        util = np.minimum(self.usage / self.cores, 1.0)
        gpu = np.where(self.gpu_count > 0, np.minimum(self.gpu_busy / np.maximum(self.gpu_count, 1), 1.0), 0.0)
        key = tuple(s.carbon.step_index(t) for s in self._sites)
        if key != self._carbon_key:
            self._carbon_now = {name: s.carbon.at(t) for name, s in self.cluster.sites.items()}
            self._carbon_key = key
        carbon_now = self._carbon_now

        held = self.sched.npods > 0

        def document() -> dict[str, Any]:
            return profile_document(self.cluster, self.nodes, util.tolist(), gpu.tolist(), carbon_now, held.tolist())

        self._view_cache = ClusterView(self.names, util, gpu, carbon_now, self.view_version, document, held)
        return self._view_cache

    # -- the scheduler ----------------------------------------------------------------------------

    def _existing_nodes(self) -> np.ndarray:
        if self._existing_dirty:
            self._existing = np.flatnonzero(self.state != OFF)
            self._existing_dirty = False
        return self._existing

    def _feasible(self, i: int) -> np.ndarray:
        """NodeResourcesFit's filter over every node (False for nodes that are not Ready)."""
        fit = self.sched.fits(self.p_needs[i])
        if self._not_ready:
            fit &= self.state == READY
        return fit

    def _schedule_one(self, i: int, t: float) -> bool:
        fit = self._feasible(i)
        if self._existing_dirty or len(self._existing) != self.n_nodes:
            existing = self._existing_nodes()
            fit = fit[existing]
        else:
            existing = None
        n_all = len(fit)
        if n_all == 0:
            return False
        want = kube.num_feasible_nodes_to_find(self.opt.percentage_of_nodes_to_score, n_all)
        start = self.next_start % n_all
        found = np.flatnonzero(fit)  # positions in the node list
        if start:  # walk the list from the rotating start index
            k = int(np.searchsorted(found, start))
            found = np.concatenate((found[k:], found[:k]))
        if len(found) > want:
            found = found[:want]
            processed = (int(found[-1]) - start) % n_all + 1
        else:
            processed = n_all
        self.next_start = (start + processed) % n_all
        if len(found) == 0:
            return False
        cand = found if existing is None else existing[found]
        ext = self.profile.extender
        ext_scores = None
        if ext is not None:
            passed, ext_scores = ext.decide(self._requests[i], cand, self._view(t), t)
            self.feasible_seen.append(len(cand))
            if not passed.all():
                cand, ext_scores = cand[passed], ext_scores[passed]
                if len(cand) == 0:
                    self.extender_rejected += 1
                    return False
        if len(cand) == 1:
            node = int(cand[0])
        else:
            node = int(cand[kube.select_host(self._total_scores(i, cand, ext_scores), self.tiebreak_rng)])
        self._start(i, node, t)
        return True

    def _total_scores(self, i: int, cand: np.ndarray, ext_scores: np.ndarray | None) -> np.ndarray:
        """kube-scheduler's total for pod ``i`` on each candidate: the plugins' and the extender's."""
        total = self.sched.scores(self.p_needs[i], cand)
        if ext_scores is not None:
            total = total + kube.extender_contribution(ext_scores, self.profile.extender_weight)
        return total

    def _start(self, i: int, n: int, t: float) -> None:
        needs = self.p_needs[i]
        self.sched.bind(needs, n)
        self.usage[n] += self.p_usage[i]
        self.gpu_busy[n] += self.p_gpu_busy[i]
        self.idle_version[n] += 1
        self._repower(n, t)
        self.outcome.node[i] = n
        self.outcome.start[i] = t
        speed = self.gpu_speed[n] if needs.gpu else self.speed[n]
        self._push(t + self.p_duration[i] / speed, FINISH, i)
        self.decisions += 1

    def _finish(self, i: int, t: float) -> None:
        n = int(self.outcome.node[i])
        self.sched.unbind(self.p_needs[i], n)
        self.usage[n] -= self.p_usage[i]
        self.gpu_busy[n] -= self.p_gpu_busy[i]
        if self.sched.npods[n] == 0:  # no rounding residue on an empty node
            self.usage[n] = 0.0
            self.gpu_busy[n] = 0.0
        self._repower(n, t)
        self.outcome.end[i] = t
        self.finished += 1
        for c in self.children[i]:
            self.waiting[c] -= 1
            if self.waiting[c] == 0:
                self._push(t, ARRIVE, c)
        self._retry_pending(n)
        if self.sched.npods[n] == 0 and self.cluster.autoscaler.enabled:
            self.idle_version[n] += 1
            self._push(t + self.cluster.autoscaler.scale_down_unneeded_seconds, SCALE_DOWN, n, self.idle_version[n])

    # -- the queues -----------------------------------------------------------------------------

    def _enqueue(self, i: int, t: float) -> None:
        if math.isnan(self.outcome.created[i]):
            self.outcome.created[i] = t
        heapq.heappush(self.active, (-self.p_priority[i], self.outcome.created[i], i))

    def _drain(self, t: float) -> None:
        while self.active:
            _, _, i = heapq.heappop(self.active)
            if not self._schedule_one(i, t):
                self.pending[i] = None
                self._pending_dirty = True
                self._scale_up_for(i, t)

    def _pending_array(self) -> np.ndarray:
        if self._pending_dirty:
            self._pending_idx = np.fromiter(self.pending, dtype=np.int64, count=len(self.pending))
            self._pending_dirty = False
        return self._pending_idx

    def _retry_pending(self, n: int) -> None:
        """Move back to the active queue the pending pods that node ``n``, which just gained room,
        will take.

        Every other node was tried since each of these pods became pending (any node that gained
        room since moved them back), so ``n`` is the only node they can fit. kube-scheduler's
        queueing hints move every pod that fits ``n`` now and schedule them in queue order
        (priority, then creation), each taking what the ones before it left; all but the first
        few fail again. Walking the queue in that order against what is left of ``n`` moves
        exactly the pods that will be placed, without the failed attempts — on a saturated
        cluster of 1,000 nodes with 100,000 pods those attempts made the replay quadratic. The
        shortcut holds while nothing but room can turn a pod away from ``n``; with power caps
        the extender can, and every pod that fits is moved as before.
        """
        if not self.pending or self.state[n] != READY:
            return
        idx = self._pending_array()
        if self.sched.free_pods[n] <= 0:
            return
        fits = (self.p_cpu[idx] <= self.sched.free_cpu[n]) & (self.p_mem[idx] <= self.sched.free_mem[n])
        fits &= self.p_gpu[idx] <= self.sched.free_gpu[n]
        moved = idx[fits]
        model = self.sched.gpu_model[n]  # NodeAffinity on the GPU model, as SchedulingState.fits
        moved = moved[[not self.p_needs[i].gpu_models or model in self.p_needs[i].gpu_models for i in moved.tolist()]]
        if len(moved) == 0:
            return
        if self._walk_retry and len(moved) > 1:
            moved = self._walk_queue(moved, n)
        for i in moved.tolist():
            del self.pending[i]
            heapq.heappush(self.active, (-self.p_priority[i], self.outcome.created[i], i))
        self._pending_dirty = True

    def _walk_queue(self, cand: np.ndarray, n: int) -> np.ndarray:
        """The pods of ``cand`` that node ``n`` takes, in queue order, each after those before it."""
        cpu, mem, gpu = int(self.sched.free_cpu[n]), int(self.sched.free_mem[n]), int(self.sched.free_gpu[n])
        slots = int(self.sched.free_pods[n])
        c_cpu, c_mem, c_gpu = self.p_cpu[cand], self.p_mem[cand], self.p_gpu[cand]
        key_priority = -self.p_priority_arr[cand]
        key_created = np.asarray(self.outcome.created)[cand]
        left = np.ones(len(cand), dtype=bool)
        taken = []
        while slots > 0:
            ok = np.flatnonzero(left & (c_cpu <= cpu) & (c_mem <= mem) & (c_gpu <= gpu))
            if len(ok) == 0:
                break
            top = ok[key_priority[ok] == key_priority[ok].min()]
            first = top[np.lexsort((cand[top], key_created[top]))[0]]  # the heap's (priority, created, index)
            taken.append(int(cand[first]))
            left[first] = False
            cpu -= int(c_cpu[first])
            mem -= int(c_mem[first])
            gpu -= int(c_gpu[first])
            slots -= 1
        return np.array(taken, dtype=np.int64)

    # -- autoscaler -----------------------------------------------------------------------------

    def _scale_up_for(self, i: int, t: float) -> None:
        auto = self.cluster.autoscaler
        if not auto.enabled:
            return
        needs = self.p_needs[i]
        need = (needs.cpu, needs.mem, needs.gpu)
        for booting, room in self.reserved.items():  # a node already booting may take it
            if needs.gpu_models and self.sched.gpu_model[booting] not in needs.gpu_models:
                continue
            if need[0] <= room[0] and need[1] <= room[1] and need[2] <= room[2] and room[3] >= 1:
                room[0] -= need[0]
                room[1] -= need[1]
                room[2] -= need[2]
                room[3] -= 1
                return
        fitting = []
        for ti, nt in enumerate(self.cluster.node_types):
            if needs.gpu_models and nt.gpus.model not in needs.gpu_models:
                continue
            if kube.milli_cpu(nt.cores) >= need[0] and nt.memory_bytes >= need[1] and nt.gpus.count >= need[2]:
                off = np.flatnonzero((self.type_of == ti) & (self.state == OFF))
                if len(off):
                    fitting.append((ti, int(off[0])))
        if not fitting:
            return
        if auto.expander == "priority":
            # cluster-autoscaler's priority expander with the ConfigMap `joulesched expander`
            # writes: priorities over every node type (policy.efficiency), the highest-priority
            # fitting type wins, ties at random as there.
            types = self.cluster.node_types
            ranking = priorities({
                nt.name: efficiency(nt.power_curve_watts, nt.cores, nt.speed, gpu_count=nt.gpus.count,
                                    gpu_idle_watts=nt.gpus.idle_watts, gpu_max_watts=nt.gpus.max_watts,
                                    gpu_speed=nt.gpus.speed)
                for nt in types
            })
            prio = {name: level for level, names in ranking.items() for name in names}
            top = max(prio[types[ti].name] for ti, _ in fitting)
            best = [item for item in fitting if prio[types[item[0]].name] == top]
            ti, n = best[int(self.expander_rng.integers(len(best)))] if len(best) > 1 else best[0]
        elif auto.expander == "least-waste":

            def waste(item: tuple[int, int]) -> float:
                nt = self.cluster.node_types[item[0]]
                return float((1 - need[0] / 1000 / nt.cores) + (1 - need[1] / nt.memory_bytes))

            ti, n = min(fitting, key=waste)
        else:
            ti, n = fitting[int(self.expander_rng.integers(len(fitting)))]
        self._advance(n, t)  # its time until now was off
        self.state[n] = BOOTING
        self._not_ready += 1
        self._existing_dirty = True
        self._repower(n, t)
        self.scale_ups += 1
        self.reserved[n] = [
            float(self.sched.alloc_cpu[n] - need[0]),
            float(self.sched.alloc_mem[n] - need[1]),
            float(self.sched.alloc_gpu[n] - need[2]),
            float(self.sched.max_pods[n] - 1),
        ]
        self._push(t + auto.scale_up_delay_seconds, NODE_READY, n)

    def _node_ready(self, n: int, t: float) -> None:
        self.state[n] = READY
        self._not_ready -= 1
        self.reserved.pop(n, None)
        self._repower(n, t)
        self._retry_pending(n)
        if self.sched.npods[n] == 0 and self.cluster.autoscaler.enabled:
            self.idle_version[n] += 1
            self._push(t + self.cluster.autoscaler.scale_down_unneeded_seconds, SCALE_DOWN, n, self.idle_version[n])

    def _scale_down(self, n: int, version: int, t: float) -> None:
        if self.state[n] != READY or self.sched.npods[n] != 0 or self.idle_version[n] != version:
            return
        ti = self.type_of[n]
        running = int(np.count_nonzero((self.type_of == ti) & (self.state != OFF)))
        if running <= self.cluster.node_types[ti].min_count:
            return
        self._advance(n, t)  # its time until now was on
        self.state[n] = OFF
        self._existing_dirty = True
        self._repower(n, t)
        self.scale_downs += 1

    # -- the loop -------------------------------------------------------------------------------

    def _push(self, t: float, kind: int, a: int, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, a, b))

    def run(self, samples: Sequence[tuple[float, int, float]] = ()) -> SimResult:
        """Replay the workload; ``samples`` are recorded (t, node, watts) that replace the model."""
        started = time.perf_counter()
        self.events: list[tuple[float, int, int, int, int]] = []
        self.active: list[tuple[int, float, int]] = []
        self.pending: dict[int, None] = {}
        self._pending_dirty = True
        self._pending_idx = np.zeros(0, dtype=np.int64)
        self.seq = 0
        self.decisions = self.finished = self.scale_ups = self.scale_downs = self.extender_rejected = 0
        self._reset_view()
        self.power_times: list[float] = [0.0]
        self.power_watts: list[float] = [self.total_power]
        self.util_log: list[tuple[float, int, float]] = []
        self.feasible_seen: list[int] = []
        self.segments: list[list[tuple[float, float, float, int]]] = (
            [[(0.0, self.power[n], 0.0, 0)] for n in range(self.n_nodes)] if self.opt.record_segments else []
        )
        for i, p in enumerate(self.pods):
            if not p.parents and i not in self.held_roots:
                self._push(p.arrival, ARRIVE, i)
        self.released = np.full(len(self.units), np.nan)
        self.release_reason = [""] * len(self.units)
        self.evaluations = 0
        for u, unit in enumerate(self.units):
            self._push(unit.terms.submitted, DEFER, u)
        for k, (ts, n, _) in enumerate(samples):
            self._push(ts, SAMPLE, n, k)
        if self.cluster.autoscaler.enabled:  # nodes idle from the start may go
            for n in range(self.n_nodes):
                self._push(self.cluster.autoscaler.scale_down_unneeded_seconds, SCALE_DOWN, n, 0)
        total = len(self.pods)
        report_every = max(1, total // 200)
        t = 0.0
        while self.events:
            t, kind, _, a, b = heapq.heappop(self.events)
            if kind == ARRIVE:
                self._enqueue(a, t)
            elif kind == FINISH:
                self._finish(a, t)
                if self.opt.progress is not None and self.finished % report_every == 0:
                    self.opt.progress(self.finished / total)
            elif kind == NODE_READY:
                self._node_ready(a, t)
            elif kind == SCALE_DOWN:
                self._scale_down(a, b, t)
            elif kind == SAMPLE:
                self._apply_sample(a, samples[b][2], t)
            elif kind == DEFER:
                self._defer(a, t)
            if self.active:
                self._drain(t)
        end = t
        for n in range(self.n_nodes):
            self._advance(n, end)
            if self.opt.record_segments:  # close every track at the end
                self.segments[n].append((end, self.power[n], self._busy(n), int(self.sched.npods[n])))
        if self.opt.record_timeseries:
            self._log_power(end)
        return self._result(end, time.perf_counter() - started)

    def _defer(self, u: int, t: float) -> None:
        """Evaluate held unit ``u``: release its roots now (each by the same delay) or look again."""
        assert self.deferrer is not None
        unit = self.units[u]
        decision = self.deferrer.decide(unit, t)
        self.evaluations += 1
        if not decision.release:
            self._push(self.deferrer.next_look(unit, t, decision), DEFER, u)
            return
        self.released[u] = t
        self.release_reason[u] = decision.reason
        delay = t - unit.terms.submitted
        for r in unit.roots:
            self._push(self.pods[r].arrival + delay, ARRIVE, r)

    def _deferral_outcome(self) -> DeferralOutcome | None:
        if self.deferrer is None:
            return None
        end = self.outcome.end
        finished = np.array([np.max(end[list(u.pods)]) for u in self.units]) if self.units else np.zeros(0)
        return DeferralOutcome(
            forecast=self.deferrer.how.forecast,
            names=[u.name for u in self.units],
            submitted=np.array([u.terms.submitted for u in self.units]),
            deadline=np.array([u.terms.deadline for u in self.units]),
            runtime=np.array([u.terms.runtime for u in self.units]),
            released=self.released,
            finished=finished,
            reasons=list(self.release_reason),
            evaluations=self.evaluations,
            forecasts_issued=self.deferrer.forecasts_issued,
        )

    def _apply_sample(self, n: int, watts: float, t: float) -> None:
        """A recorded power sample: node ``n`` draws ``watts`` until the next one (NaN: the model again)."""
        self._advance(n, t)
        if math.isnan(watts):
            self.curves[n], self.gpu_idle[n], self.gpu_max[n] = self._model[n]
        else:
            if n not in self._model:
                self._model[n] = (self.curves[n], self.gpu_idle[n], self.gpu_max[n])
            self.curves[n] = (watts,) * 11
            self.gpu_idle[n] = 0.0
            self.gpu_max[n] = 0.0
        self._repower(n, t)

    def _result(self, end: float, wall: float) -> SimResult:
        energy = np.array(self.energy)
        facility = facility_joules(energy, np.array(self.pue))
        return SimResult(
            profile=self.profile.name,
            nodes=self.nodes,
            end_time=end,
            energy_joules=energy,
            carbon_grams=self._carbon_grams(energy, facility),
            facility_joules=facility,
            on_seconds=np.array(self.on_seconds),
            pods=self.outcome,
            unscheduled=int(np.count_nonzero(np.isnan(self.outcome.start))),  # pending, and what waited on them
            decisions=self.decisions,
            extender_calls=self.profile.extender.calls if self.profile.extender is not None else 0,
            scale_ups=self.scale_ups,
            scale_downs=self.scale_downs,
            wall_seconds=wall,
            power_times=self.power_times,
            power_watts=self.power_watts,
            util_log=self.util_log,
            segments=self.segments,
            feasible_seen=self.feasible_seen,
            deferral=self._deferral_outcome(),
        )

    def _carbon_grams(self, energy: np.ndarray, facility: np.ndarray) -> np.ndarray:
        """Each node's operational CO2e: its facility energy × the intensity its energy was drawn
        at (energy-weighted over the run; a node that drew nothing emitted nothing)."""
        weighted = np.array(self.intensity_ws)
        intensity = np.divide(weighted, energy, out=np.zeros_like(weighted), where=energy > 0.0)
        grams: np.ndarray = operational_grams(facility, intensity)
        return grams

    def extend_to(self, result: SimResult, horizon: float) -> None:
        """Carry every node's final state on to ``horizon`` (to compare runs over one window)."""
        if horizon <= result.end_time:
            return
        for n in range(self.n_nodes):
            self._advance(n, horizon)
        result.energy_joules = np.array(self.energy)
        result.facility_joules = facility_joules(result.energy_joules, np.array(self.pue))
        result.carbon_grams = self._carbon_grams(result.energy_joules, result.facility_joules)
        result.on_seconds = np.array(self.on_seconds)
        if result.power_times and self.opt.record_timeseries:
            result.power_times.append(horizon)
            result.power_watts.append(self.total_power)
        if self.opt.record_segments:
            for n in range(self.n_nodes):
                result.segments[n].append((horizon, self.power[n], self._busy(n), int(self.sched.npods[n])))
        result.end_time = horizon
