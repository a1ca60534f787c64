"""Predicted load: pods placed on a node that its measurements do not show yet.

Power readings lag placements by a scrape interval or more. Without a memory of recent
placements, a burst of pods all land on the node that looked best a moment ago (herding).
The ledger remembers each placement — from our own bind verb, from the pod-binding watch, or
from our own top choice at prioritize time — and counts it as load on its node until a
measurement taken ``settle_seconds`` after the placement exists, or ``ttl_seconds`` pass.
A pod is keyed by UID, so a retried pod moves instead of counting twice.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from joulesched.policy.demand import MAX_CPU_CORES, MAX_GPUS


@dataclass(frozen=True)
class Placement:
    node: str
    cores: float
    gpus: float
    at: float
    confirmed: bool  # bound (watch or bind verb) rather than only our top choice


class PredictedLoad:
    def __init__(self, ttl_seconds: float, settle_seconds: float, max_pods: int = 100_000) -> None:
        self.ttl = ttl_seconds
        self.settle = settle_seconds
        self.max_pods = max_pods
        self._pods: dict[str, Placement] = {}
        self._lock = threading.Lock()
        # per_row() result, reused until the ledger or the profiles change or a second passes
        self._cached: tuple[object, float, np.ndarray, np.ndarray] | None = None

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
            if old is not None and old.node == node:
                at = old.at  # the same placement seen again keeps its first time
            if old is not None and confirmed and not old.confirmed and cores == 0 and gpus == 0:
                # The bind verb names the node but not the pod's demand, which the top choice
                # it corrects knew: the load moves to the real node instead of vanishing.
                cores, gpus = old.cores, old.gpus
            self._pods[uid] = Placement(node, cores, gpus, at, confirmed)
            self._cached = None
            if len(self._pods) > self.max_pods:
                oldest = min(self._pods, key=lambda k: self._pods[k].at)
                del self._pods[oldest]

    def placement(self, uid: str) -> Placement | None:
        return self._pods.get(uid)

    def forget(self, uid: str) -> None:
        with self._lock:
            if self._pods.pop(uid, None) is not None:
                self._cached = None

    def per_row(self, index: Mapping[str, int], updated: np.ndarray, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Predicted (cores, gpus) per profile row; expires what measurements now show.

        The arrays are shared between calls until something changes: callers must not write.
        """
        cached = self._cached
        if cached is not None and cached[0] is updated and 0 <= now - cached[1] < 1.0:
            return cached[2], cached[3]
        cores = np.zeros(len(updated))
        gpus = np.zeros(len(updated))
        with self._lock:
            expired = []
            for uid, p in self._pods.items():
                row = index.get(p.node)
                measured_after = row is not None and not np.isnan(updated[row]) and updated[row] >= p.at + self.settle
                if now - p.at > self.ttl or measured_after:
                    expired.append(uid)
                elif row is not None:
                    cores[row] += p.cores
                    gpus[row] += p.gpus
            for uid in expired:
                del self._pods[uid]
            self._cached = (updated, now, cores, gpus)
        return cores, gpus


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
            self._ends[uid] = (node, until)
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
