"""Predicted load: pods placed on a node that its measurements do not show yet.

Power readings lag placements by a scrape interval or more. Without a memory of recent
placements, a burst of pods all land on the node that looked best a moment ago (herding).
The ledger remembers each placement — from our own bind verb, from the pod-binding watch, or
from our own top choice at prioritize time — and counts it as load on its node until a
measurement taken ``settle_seconds`` after the placement exists, or ``ttl_seconds`` pass.
A pod is keyed by UID, so a retried pod moves instead of counting twice.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from joulesched.policy.demand import MAX_CPU_CORES, MAX_GPUS


@dataclass(frozen=True)
class Placement:
    node: str
    cores: float
    gpus: float
    at: float
    confirmed: bool  # bound (watch or bind verb) rather than only our top choice


class RowLoad(NamedTuple):
    """The ledger per profile row: predicted cores and GPUs, and the placements they sum."""

    cores: np.ndarray
    gpus: np.ndarray
    pods: np.ndarray  # int64

    def without(self, row: int, own: Placement) -> RowLoad:
        """This load less one placement counted on ``row`` (a pod asked about again is not its
        own load): new arrays. A row left with no placement reads exactly 0, not what float
        subtraction leaves of an incremental sum (1e-17 cores reads as an occupied node)."""
        cores, gpus, pods = self.cores.copy(), self.gpus.copy(), self.pods.copy()
        pods[row] -= 1
        if pods[row] <= 0:
            pods[row], cores[row], gpus[row] = 0, 0.0, 0.0
        else:
            cores[row] = max(cores[row] - own.cores, 0.0)
            gpus[row] = max(gpus[row] - own.gpus, 0.0)
        return RowLoad(cores, gpus, pods)


@dataclass(frozen=True)
class _Cache:
    """per_row()'s load for one (index, updated) pair, from a pass over the ledger at
    ``passed_at`` and kept current record by record until the clock reaches ``ahead``: the
    earliest measurement then stamped ahead of it (inf: none)."""

    index: Mapping[str, int]
    updated: np.ndarray
    load: RowLoad
    passed_at: float
    ahead: float


class PredictedLoad:
    def __init__(self, ttl_seconds: float, settle_seconds: float, max_pods: int = 100_000) -> None:
        self.ttl = ttl_seconds
        self.settle = settle_seconds
        self.max_pods = max_pods
        self._pods: dict[str, Placement] = {}
        self._lock = threading.Lock()
        # (at, uid) of every placement recorded, oldest first: the TTL expires from its top.
        # An entry whose placement has since moved or gone is skipped when it comes up.
        self._by_age: list[tuple[float, str]] = []
        # per_row()'s arrays for one (index, updated) pair, kept current record by record: a
        # burst records a pod per request, and summing the whole ledger again for each request
        # made the ledger the costliest part of a names-mode request (0.5 ms of 1.2 ms at 1,000
        # pods in flight). Replaced, never written in place: callers may still hold the last.
        # Placements per row alongside: a row whose last one leaves is set to exactly 0, not to
        # what float subtraction leaves (a node with 1e-17 cores predicted reads as occupied).
        self._cached: _Cache | None = None

    def __len__(self) -> int:
        return len(self._pods)

    def record(self, uid: str, node: str, cores: float, gpus: float, at: float, *, confirmed: bool) -> None:
        if not uid or self.ttl <= 0:
            return
        if not (0 <= cores <= MAX_CPU_CORES and 0 <= gpus <= MAX_GPUS and math.isfinite(at)):
            return  # NaN fails every comparison: only finite, physical loads enter the ledger
        with self._lock:
            old = self._pods.get(uid)
            if old is not None and old.confirmed and not confirmed:
                return  # a bound pod is where it is; a later guess does not move it
            if old is not None and old.node == node and (old.confirmed or not confirmed):
                at = old.at  # the same placement seen again keeps its first time
            # (a guess confirmed takes the binding's time: the TTL and the settling run from
            # when the pod was bound, which a PreBind wait can hold long after the decision)
            placed = Placement(node, cores, gpus, at, confirmed)
            if placed == old:
                return  # the watch seeing a binding the bind verb recorded: nothing moves
            self._pods[uid] = placed
            heapq.heappush(self._by_age, (at, uid))
            self._adjust(old, placed)
            if len(self._pods) > self.max_pods:
                self._evict_oldest()
            self._compact()

    def placement(self, uid: str) -> Placement | None:
        return self._pods.get(uid)

    def forget(self, uid: str) -> None:
        with self._lock:
            old = self._pods.pop(uid, None)
            if old is not None:
                self._adjust(old, None)
                self._compact()

    def _adjust(self, old: Placement | None, new: Placement | None) -> None:
        """Carry one placement's change into the cached arrays (under the lock)."""
        cached = self._cached
        if cached is None:
            return
        index, updated = cached.index, cached.updated
        changes = []
        if old is not None and (row := index.get(old.node)) is not None:
            changes.append((row, -old.cores, -old.gpus, -1))
        if new is not None and (row := index.get(new.node)) is not None:
            if new.at + self.settle <= updated[row] <= cached.passed_at:
                self._cached = None  # measured already: per_row's full pass expires it
                return
            changes.append((row, new.cores, new.gpus, 1))
        if changes:
            cores, gpus, counts = cached.load.cores.copy(), cached.load.gpus.copy(), cached.load.pods.copy()
            for row, c, g, k in changes:
                counts[row] += k
                if counts[row] == 0:
                    cores[row] = gpus[row] = 0.0
                else:
                    cores[row] += c
                    gpus[row] += g
            self._cached = _Cache(index, updated, RowLoad(cores, gpus, counts), cached.passed_at, cached.ahead)

    def per_row(self, index: Mapping[str, int], updated: np.ndarray, now: float) -> RowLoad:
        """Predicted load per profile row; expires what measurements now show. Every placement
        left in the ledger on a node of ``index`` is counted in it.

        The arrays are shared between calls until something changes: callers must not write.
        """
        with self._lock:
            return self._per_row(index, updated, now)

    def per_row_and_own(
        self, index: Mapping[str, int], updated: np.ndarray, now: float, uid: str
    ) -> tuple[RowLoad, Placement | None]:
        """:meth:`per_row`, and pod ``uid``'s placement where it is counted in it (on a node of
        ``index``), read together: a placement recorded between the two reads would be taken
        off a load that never counted it."""
        with self._lock:
            load = self._per_row(index, updated, now)
            own = self._pods.get(uid)
            return load, own if own is not None and own.node in index else None

    def _per_row(self, index: Mapping[str, int], updated: np.ndarray, now: float) -> RowLoad:
        cached = self._cached
        if cached is not None and cached.index is index and _same_array(cached.updated, updated) and now < cached.ahead:
            self._expire_old(now)
            if self._cached is not None:
                return self._cached.load
        # New profiles (a measurement may now show a placement), a new index, or the clock past
        # a measurement that was stamped ahead of it: one pass.
        cores = np.zeros(len(updated))
        gpus = np.zeros(len(updated))
        counts = np.zeros(len(updated), dtype=np.int64)
        expired = []
        for uid, p in self._pods.items():
            row = index.get(p.node)
            # A measurement stamped ahead of now (a clock ahead of ours) shows nothing yet.
            measured_after = row is not None and p.at + self.settle <= updated[row] <= now
            if now - p.at > self.ttl or measured_after:
                expired.append(uid)
            elif row is not None:
                cores[row] += p.cores
                gpus[row] += p.gpus
                counts[row] += 1
        for uid in expired:
            del self._pods[uid]
        self._by_age = [(p.at, uid) for uid, p in self._pods.items()]
        heapq.heapify(self._by_age)
        later = updated[updated > now]
        load = RowLoad(cores, gpus, counts)
        self._cached = _Cache(index, updated, load, now, float(later.min()) if later.size else math.inf)
        return load

    def _compact(self) -> None:
        """Drop the entries of placements that moved or went from ``_by_age`` once they are
        most of it (under the lock). Only the TTL and eviction pop entries, and only per_row
        expires by the TTL: a replica that makes no decisions (a standby) but watches pods
        kept an entry for every pod ever bound. Rebuilt past twice the live placements, the
        heap stays within that, at amortised constant cost per record."""
        if len(self._by_age) > 2 * len(self._pods) + 1024:
            self._by_age = [(p.at, uid) for uid, p in self._pods.items()]
            heapq.heapify(self._by_age)

    def _evict_oldest(self) -> None:
        """Forget the oldest placement (the ledger is full): the first live entry of ``_by_age``.

        Every placement has an entry there with its own time; entries of placements that moved
        or went are skipped. Before, a scan of the whole ledger for every record once it was
        full (100,000 placements: milliseconds a request).
        """
        heap = self._by_age
        while heap:
            at, uid = heapq.heappop(heap)
            p = self._pods.get(uid)
            if p is not None and p.at == at:
                del self._pods[uid]
                self._adjust(p, None)
                return

    def _expire_old(self, now: float) -> None:
        heap = self._by_age
        while heap and now - heap[0][0] > self.ttl:
            at, uid = heapq.heappop(heap)
            p = self._pods.get(uid)
            if p is not None and p.at == at:
                del self._pods[uid]
                self._adjust(p, None)


def _same_array(kept: object, given: np.ndarray) -> bool:
    """The same array, or another view of the same column of the same table.

    A profile set hands out each named column as one view, the same every time
    (NodeArrays); another view of that column (``NodeArrays.column``) matches too.
    """
    if kept is given:
        return True
    if not isinstance(kept, np.ndarray) or kept.base is None or kept.base is not given.base:
        return False
    return kept.__array_interface__ == given.__array_interface__


class Occupancy:
    """Which nodes hold workload pods, and until when: the ``held_until`` the policy needs.

    Fed by the pod-binding watch with every bound pod that is not a DaemonSet's (a DaemonSet
    pod runs on every node and keeps none of them on) and has not terminated. A pod that
    declares its runtime (``joulesched.io/expected-runtime-seconds``) holds its node until it
    started plus that runtime; any other pod holds it for good (a service nobody knows the end
    of). A node with none of them is empty: its idle power is the pod's to answer for when the
    node could be powered down (docs/policy.md, "Idle power").

    Until the watch has listed the pods once, nothing is known and :meth:`per_row` gives NaN
    (treated as held), so a restart never makes every node look empty.
    """

    def __init__(self) -> None:
        self._ends: dict[str, tuple[str, float]] = {}  # uid -> (node, held until)
        self._synced = False
        self._lock = threading.Lock()
        self._cached: tuple[int, object, np.ndarray] | None = None
        self._version = 0

    def replace(self, pods: Mapping[str, tuple[str, float]]) -> None:
        """Every workload pod at once (a fresh listing): uid -> (node, held until)."""
        with self._lock:
            self._ends = dict(pods)
            self._synced = True
            self._version += 1

    def set(self, uid: str, node: str, until: float) -> None:
        with self._lock:
            old = self._ends.get(uid)
            if old == (node, until):
                return  # every status update of a bound pod comes here: nothing changed
            self._ends[uid] = (node, until)
            cached = self._cached
            if old is None and cached is not None and cached[0] == self._version and self._synced:
                # A newly bound pod can only raise its row's held_until: update a copy in
                # place of a pass over every pod of the cluster, once per binding of a burst.
                _, index, held = cached
                assert isinstance(index, Mapping)
                self._version += 1
                row = index.get(node)
                if row is not None and until > held[row]:
                    held = held.copy()
                    held[row] = until
                    held.setflags(write=False)
                self._cached = (self._version, index, held)
                return
            self._version += 1

    def forget(self, uid: str) -> None:
        with self._lock:
            if self._ends.pop(uid, None) is not None:
                self._version += 1

    def per_row(self, index: Mapping[str, int], rows: int) -> np.ndarray:
        """``held_until`` per profile row: 0 for an empty node, NaN before the first listing."""
        cached = self._cached
        if cached is not None and cached[0] == self._version and cached[1] is index:
            return cached[2]
        with self._lock:
            version = self._version
            if not self._synced:
                held = np.full(rows, np.nan)
            else:
                held = np.zeros(rows)
                for node, until in self._ends.values():
                    row = index.get(node)
                    if row is not None and until > held[row]:
                        held[row] = until
        held.setflags(write=False)
        self._cached = (version, index, held)
        return held


class Unbound:
    """Pods the extender has answered for and whose binding it has not seen yet.

    kube-scheduler decides pods one after another in one loop and binds each in a goroutine of
    its own, so with the bind verb pod A's ``bind`` and pod B's ``filter`` reach the extender
    at about the same moment, in either order. B decided first is B decided as if A were
    nowhere: in a burst, pod after pod lands on the node whose last few placements the ledger
    has not heard of (tests/e2e/test_saturation_e2e.py). So while bindings arrive through the
    bind verb, a decision first waits for the bindings of the pods answered before it — at
    most ``wait_seconds`` in all, and for each pod once: a pod still unbound at the deadline
    (unschedulable after all, or held in kube-scheduler's PreBind, e.g. by a volume) is
    dropped, so it delays one decision at most, and nothing waits again until the next bind
    arrives (a scheduler whose config no longer names the bind verb costs one wait).

    The wait also holds kube-scheduler to the pace of the bindings. With ``filter_keeps: best``
    the ledger knows each pod's node from its filter, but without the wait kube-scheduler,
    which then skips scoring, sent binds faster than the API server took them: they queued past
    its httpTimeout, kube-scheduler bound those pods itself, got 409 and counted them failed
    (881 of 1,000 pods counted in 60 s; docs/benchmarks.md, "Choosing the node").

    Without the bind verb there is nothing to wait for (the pod watch learns a binding only
    after kube-scheduler's rate-limited API write, a burst later), and nothing waits. Both are
    kept per scheduler (the pod's ``spec.schedulerName``): a scheduler that binds by itself,
    sharing the extender with one that binds through it, neither waits for its pods' bindings
    to reach the watch nor makes the other's decisions wait for them.
    """

    # A bind seen this recently means that scheduler binds through this extender.
    ACTIVE_SECONDS = 60.0

    def __init__(
        self,
        wait_seconds: float,
        max_pods: int = 10_000,
        monotonic: Callable[[], float] = time.monotonic,
        on_wait: Callable[[str, float], None] | None = None,
    ) -> None:
        self.wait_seconds = wait_seconds
        self.on_wait = on_wait  # called with "bound" or "deadline" and the seconds, after a decision waited
        self.max_pods = max_pods
        self._monotonic = monotonic
        # uid -> (cores, gpus, scheduler) of recent answers, for the bind verb, which names only
        # the node: kept past a deadline (a late bind still knows its pod's load), bounded by max_pods.
        self._demand: OrderedDict[str, tuple[float, float, str]] = OrderedDict()
        self._waiting: dict[str, str] = {}  # uid -> scheduler: answered while its scheduler was active, not bound yet
        self._cond = threading.Condition()
        self._last_bind: dict[str, float] = {}  # scheduler -> when a bind of one of its pods last came

    def decided(self, uid: str, cores: float, gpus: float, scheduler: str = "") -> None:
        """``uid`` was answered (filter with a node passing, or prioritize) with this demand."""
        if not uid:
            return
        with self._cond:
            self._demand[uid] = (cores, gpus, scheduler)
            self._demand.move_to_end(uid)
            while len(self._demand) > self.max_pods:
                self._waiting.pop(self._demand.popitem(last=False)[0], None)
            if self.active(scheduler):
                self._waiting[uid] = scheduler

    def demand(self, uid: str) -> tuple[float, float] | None:
        entry = self._demand.get(uid)
        return None if entry is None else entry[:2]

    def bound(self, uid: str, *, by_bind_verb: bool) -> None:
        with self._cond:
            entry = self._demand.pop(uid, None)
            if by_bind_verb and entry is not None:  # a pod never answered here names no scheduler
                now = self._monotonic()
                if entry[2] not in self._last_bind:
                    self._last_bind = {s: t for s, t in self._last_bind.items() if now - t < self.ACTIVE_SECONDS}
                self._last_bind[entry[2]] = now
            if self._waiting.pop(uid, None) is not None:
                self._cond.notify_all()

    def active(self, scheduler: str = "") -> bool:
        """Whether a bind of one of ``scheduler``'s pods came through the bind verb lately."""
        return self._monotonic() - self._last_bind.get(scheduler, -math.inf) < self.ACTIVE_SECONDS

    def wait_for_others(self, uid: str, scheduler: str = "") -> float:
        """Wait until every other pod of ``scheduler`` answered and not yet bound is bound; seconds waited.

        kube-scheduler answers one pod at a time, so these are the pods answered before
        ``uid`` (two schedulers of one name sharing the extender would also wait on each other's).
        """
        if self.wait_seconds <= 0 or not self.active(scheduler):
            return 0.0
        start = self._monotonic()
        deadline = start + self.wait_seconds
        outcome = None
        with self._cond:
            while any(s == scheduler and u != uid for u, s in self._waiting.items()):
                outcome = "bound"
                left = deadline - self._monotonic()
                if left <= 0:
                    self._waiting = {u: s for u, s in self._waiting.items() if s != scheduler or u == uid}
                    outcome = "deadline"
                    self._last_bind.pop(scheduler, None)
                    break
                self._cond.wait(left)
        waited = self._monotonic() - start
        if outcome is not None and self.on_wait is not None:
            self.on_wait(outcome, waited)
        return waited
