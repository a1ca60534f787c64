"""The predicted-load ledger kept current record by record equals summing it from scratch."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from joulesched.extender.predicted import PredictedLoad, RowLoad, Unbound

NODES = ["a", "b", "c", "d"]


def from_scratch(ledger: PredictedLoad, index: dict[str, int], updated: np.ndarray, now: float) -> tuple[list, list, list]:
    cores, gpus, pods = [0.0] * len(updated), [0.0] * len(updated), [0] * len(updated)
    for p in ledger._pods.values():
        row = index.get(p.node)
        if (
            row is None
            or now - p.at > ledger.ttl
            or (not np.isnan(updated[row]) and p.at + ledger.settle <= updated[row] <= now)
        ):
            continue
        cores[row] += p.cores
        gpus[row] += p.gpus
        pods[row] += 1
    return cores, gpus, pods


def test_incremental_arrays_match_a_full_pass_through_records_moves_forgets_and_expiry() -> None:
    rng = random.Random(7)
    index = {n: i for i, n in enumerate(NODES[:3])}  # "d" has no profile row
    updated = np.array([0.0, np.nan, 0.0])
    ledger = PredictedLoad(ttl_seconds=30, settle_seconds=5)
    now = 1000.0
    for step in range(3000):
        action = rng.random()
        uid = f"u{rng.randrange(60)}"
        if action < 0.6:
            cores = rng.choice([0.0, 0.1, 0.25, 1.0, 16.0])
            ledger.record(uid, rng.choice(NODES), cores, float(rng.randrange(2)), now, confirmed=rng.random() < 0.3)
        elif action < 0.75:
            ledger.forget(uid)
        elif action < 0.97:
            now += rng.random() * 3
        else:  # new measurements: a new array, as a profile reload makes
            updated = np.array([now - rng.random() * 20, np.nan, now - 50])
        cores, gpus, pods = ledger.per_row(index, updated, now)
        want_cores, want_gpus, want_pods = from_scratch(ledger, index, updated, now)
        assert pods.tolist() == want_pods, step
        assert np.allclose(cores, want_cores, atol=1e-9), step
        assert np.allclose(gpus, want_gpus, atol=1e-9), step
        # a row with nothing on it is exactly empty, never a float residue
        for row, value in enumerate(want_cores):
            if not any(index.get(p.node) == row for p in ledger._pods.values()):
                assert cores[row] == 0.0 and gpus[row] == 0.0, step
                assert value == 0.0


def test_a_row_is_exactly_empty_once_its_placements_leave() -> None:
    index, updated = {"a": 0}, np.array([np.nan])
    ledger = PredictedLoad(300, 45)
    ledger.per_row(index, updated, 0.0)
    ledger.record("x", "a", 0.1, 0, 0.0, confirmed=True)
    ledger.record("y", "a", 0.2, 0, 0.0, confirmed=True)
    assert ledger.per_row(index, updated, 1.0)[0][0] == 0.1 + 0.2
    ledger.forget("x")
    ledger.forget("y")
    cores, _, _ = ledger.per_row(index, updated, 2.0)
    assert cores[0] == 0.0 and not cores[0] > 0
    ledger.record("z", "a", 1.0, 0, 2.0, confirmed=False)
    assert ledger.per_row(index, updated, 303.0)[0][0] == 0.0  # past the TTL
    assert len(ledger) == 0


def test_the_arrays_are_reused_across_fresh_views_of_the_same_profile_table() -> None:
    # The profiles hand out each column as a new view of one table on every request.
    table = np.array([[0.0, 1.0], [0.0, 2.0]])
    index = {"a": 0, "b": 1}
    ledger = PredictedLoad(300, 45)
    ledger.record("x", "a", 2.0, 0, 10.0, confirmed=True)
    first = ledger.per_row(index, table[:, 0], 11.0)
    again = ledger.per_row(index, table[:, 0], 12.0)
    assert again[0] is first[0] and again[1] is first[1]  # no pass over the ledger
    assert ledger.per_row(index, table[:, 1], 12.0)[0] is not first[0]  # another column: a new pass
    ledger.record("y", "b", 1.0, 0, 12.0, confirmed=True)
    assert ledger.per_row(index, table[:, 1], 13.0)[0].tolist() == [2.0, 1.0]


def test_a_full_ledger_forgets_its_oldest_placement_and_its_arrays_follow() -> None:
    rng = random.Random(11)
    index = {n: i for i, n in enumerate(NODES)}
    updated = np.full(len(NODES), np.nan)
    ledger = PredictedLoad(ttl_seconds=600, settle_seconds=5, max_pods=5)
    now = 1000.0
    ledger.per_row(index, updated, now)
    for step in range(3000):
        uid = f"u{rng.randrange(12)}"
        action = rng.random()
        if action < 0.1:
            ledger.forget(uid)
        elif action < 0.15:
            now += rng.random() * 100  # placements past the TTL expire from the same heap
        elif action < 0.2:
            updated = np.full(len(NODES), np.nan)  # new profiles: a full pass rebuilds the heap
        else:
            before = {k: p.at for k, p in ledger._pods.items() if now - p.at <= ledger.ttl}
            # bindings come back out of order, and the same pod again on its node keeps its time
            at = now - rng.randrange(300)
            ledger.record(uid, rng.choice(NODES), rng.choice([0.5, 1.0, 2.0]), 0.0, at, confirmed=True)
            assert len(ledger) <= 5, step
            if len(before) == 5 and uid not in before and len(ledger._pods) == 5:
                # the one forgotten is the oldest of the six, the new one included
                times = {**before, uid: at}
                gone = set(times) - set(ledger._pods)
                assert len(gone) == 1, step
                assert times[gone.pop()] == min(times.values()), step
        cores, _, _ = ledger.per_row(index, updated, now)
        assert np.allclose(cores, from_scratch(ledger, index, updated, now)[0]), step


# -- Unbound: a decision waits for the bindings of the pods answered before it ----------------------


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_nothing_waits_until_a_binding_has_come_through_the_bind_verb() -> None:
    outcomes: list[tuple[str, float]] = []
    unbound = Unbound(0.5, on_wait=lambda outcome, seconds: outcomes.append((outcome, seconds)))
    unbound.decided("a", 1.0, 0.0)
    started = time.monotonic()
    assert unbound.wait_for_others("b") == 0.0  # no bind seen: kube-scheduler binds itself
    assert time.monotonic() - started < 0.1 and outcomes == []


def bind_through_the_verb(unbound: Unbound, uid: str = "earlier", scheduler: str = "") -> None:
    """A pod answered and bound through the bind verb: its scheduler binds through the extender."""
    unbound.decided(uid, 1.0, 0.0, scheduler)
    unbound.bound(uid, by_bind_verb=True)


def test_a_decision_waits_for_the_binding_of_the_pod_before_it() -> None:
    outcomes: list[tuple[str, float]] = []
    unbound = Unbound(5.0, on_wait=lambda outcome, seconds: outcomes.append((outcome, seconds)))
    bind_through_the_verb(unbound)
    unbound.decided("a", 1.0, 0.0)
    assert unbound.demand("a") == (1.0, 0.0)
    threading.Timer(0.2, lambda: unbound.bound("a", by_bind_verb=True)).start()
    waited = unbound.wait_for_others("b")
    assert 0.15 < waited < 4.0, waited
    assert outcomes == [("bound", waited)] and unbound.demand("a") is None
    # Its own earlier answer (filter before prioritize) is not waited for.
    unbound.decided("b", 1.0, 0.0)
    assert unbound.wait_for_others("b") < 0.1 and len(outcomes) == 1


def test_a_pod_never_bound_delays_one_decision_by_the_deadline_and_no_more() -> None:
    outcomes: list[tuple[str, float]] = []
    unbound = Unbound(0.3, on_wait=lambda outcome, seconds: outcomes.append((outcome, seconds)))
    bind_through_the_verb(unbound)
    unbound.decided("unschedulable", 1.0, 0.0)
    waited = unbound.wait_for_others("b")
    assert 0.25 < waited < 2.0, waited
    assert outcomes == [("deadline", waited)]
    assert unbound.demand("unschedulable") == (1.0, 0.0)  # a late bind still knows its load
    assert unbound.wait_for_others("c") < 0.1 and len(outcomes) == 1
    # Nothing waits again until a bind comes: a scheduler no longer binding through the
    # extender costs one wait, not one per pod.
    unbound.decided("c", 1.0, 0.0)
    assert not unbound.active() and unbound.wait_for_others("d") == 0.0
    unbound.bound("c", by_bind_verb=True)
    assert unbound.active()


def test_a_binding_seen_by_the_watch_ends_the_wait_but_does_not_make_waiting_active() -> None:
    clock = FakeMonotonic()
    unbound = Unbound(0.3, monotonic=clock)
    unbound.decided("a", 1.0, 0.0)
    unbound.bound("a", by_bind_verb=False)
    assert not unbound.active() and unbound.demand("a") is None
    bind_through_the_verb(unbound, "x")
    assert unbound.active()
    clock.now += Unbound.ACTIVE_SECONDS + 1
    assert not unbound.active()  # the bind verb no longer used: nothing waits


def test_a_bind_of_a_pod_never_answered_here_makes_no_scheduler_wait() -> None:
    # Answered by another replica (or before a restart): it names no scheduler.
    unbound = Unbound(5.0)
    unbound.bound("elsewhere", by_bind_verb=True)
    assert not unbound.active()
    unbound.decided("a", 1.0, 0.0)
    assert unbound.wait_for_others("b") == 0.0


def test_a_scheduler_that_binds_by_itself_does_not_wait_beside_one_that_binds_through_the_verb() -> None:
    # kube-scheduler profile "with-bind" binds through the extender; "plain" binds itself,
    # its bindings reach the extender through the pod watch only, a batch later.
    outcomes: list[tuple[str, float]] = []
    unbound = Unbound(5.0, on_wait=lambda outcome, seconds: outcomes.append((outcome, seconds)))
    bind_through_the_verb(unbound, "earlier", "with-bind")
    assert unbound.active("with-bind") and not unbound.active("plain")
    unbound.decided("p1", 1.0, 0.0, "plain")
    started = time.monotonic()
    assert unbound.wait_for_others("p2", "plain") == 0.0  # p1's binding is not waited for
    unbound.decided("p2", 1.0, 0.0, "plain")
    # nor do "with-bind"'s decisions wait for "plain"'s pods
    assert unbound.wait_for_others("w1", "with-bind") < 0.05
    assert time.monotonic() - started < 0.1 and outcomes == []
    # while "with-bind" still waits for its own
    unbound.decided("w1", 1.0, 0.0, "with-bind")
    threading.Timer(0.2, lambda: unbound.bound("w1", by_bind_verb=True)).start()
    waited = unbound.wait_for_others("w2", "with-bind")
    assert 0.15 < waited < 4.0 and outcomes == [("bound", waited)]


def test_a_deadline_turns_waiting_off_for_its_scheduler_only() -> None:
    outcomes: list[str] = []
    unbound = Unbound(1.0, on_wait=lambda outcome, seconds: outcomes.append(outcome))
    bind_through_the_verb(unbound, "w0", "a")
    bind_through_the_verb(unbound, "q0", "b")
    unbound.decided("w1", 1.0, 0.0, "a")  # never bound
    unbound.decided("q1", 1.0, 0.0, "b")
    assert 0.9 < unbound.wait_for_others("w2", "a") < 3.0
    assert outcomes == ["deadline"] and not unbound.active("a") and unbound.active("b")
    # "b"'s pod is still waited for, until its binding
    threading.Timer(0.1, lambda: unbound.bound("q1", by_bind_verb=True)).start()
    assert 0.05 < unbound.wait_for_others("q2", "b") and outcomes == ["deadline", "bound"]


def test_the_demand_kept_for_binds_is_bounded() -> None:
    unbound = Unbound(0.0, max_pods=3)
    for i in range(5):
        unbound.decided(f"p{i}", float(i), 0.0)
    assert [unbound.demand(f"p{i}") for i in range(5)] == [None, None, (2.0, 0.0), (3.0, 0.0), (4.0, 0.0)]


def test_the_pod_watch_records_a_binding_before_it_ends_a_wait_for_it() -> None:
    from joulesched.extender.kube import PodBindingWatch

    predicted = PredictedLoad(300, 30)
    seen = []

    class Checking(Unbound):
        def bound(self, uid: str, *, by_bind_verb: bool) -> None:
            seen.append(predicted.placement(uid))  # what a waiter woken now would find
            super().bound(uid, by_bind_verb=by_bind_verb)

    watch = PodBindingWatch("", predicted, clock=lambda: 1000.0, unbound=Checking(0.2))
    pod = {
        "metadata": {"uid": "a", "name": "a", "namespace": "default"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
    }
    watch.handle("MODIFIED", pod)
    (placed,) = seen
    assert placed is not None and (placed.node, placed.cores, placed.confirmed) == ("n1", 2.0, True)


def test_the_pod_watch_records_the_listed_pods_bound_within_the_ttl_at_their_binding_time() -> None:
    # An extender started mid-burst (a replica of a rolling update) lists pods bound seconds
    # ago: load no measurement shows yet. Each is recorded at its binding time (PodScheduled's
    # last transition to True), so it expires as the ledger's own placements do.
    from datetime import UTC, datetime

    from joulesched.extender.kube import PodBindingWatch

    def at(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def pod(uid: str, *, scheduled: float | None = None, created: float = 0.0, phase: str = "Running") -> dict:
        conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": at(created)}]
        if scheduled is not None:
            conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": at(scheduled)})
        return {
            "metadata": {"uid": uid, "name": uid, "namespace": "default", "creationTimestamp": at(created)},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
            "status": {"phase": phase, "conditions": conditions},
        }

    predicted = PredictedLoad(ttl_seconds=300, settle_seconds=30)
    watch = PodBindingWatch("", predicted, clock=lambda: 100_000.0)
    items = [
        pod("recent", scheduled=99_990, created=99_000),  # bound 10 s ago, created long before
        pod("old", scheduled=99_600, created=99_000),  # bound 400 s ago: past the TTL
        pod("on-its-node", created=99_995),  # created with its node: no PodScheduled condition
        pod("done", scheduled=99_990, phase="Succeeded"),  # terminated: holds no CPU
        pod("ahead", scheduled=100_003),  # the API server's clock 3 s ahead of ours
    ]
    watch.record_listed(items)
    placed = {uid: predicted.placement(uid) for uid in ("recent", "old", "on-its-node", "done", "ahead")}
    assert {uid: (p.node, p.cores, p.at, p.confirmed) for uid, p in placed.items() if p is not None} == {
        "recent": ("n1", 2.0, 99_990.0, True),
        "on-its-node": ("n1", 2.0, 99_995.0, True),
        "ahead": ("n1", 2.0, 100_000.0, True),
    }
    # Listed again (the watch lists again after an error) a while later: nothing moves.
    watch.clock = lambda: 100_020.0
    watch.record_listed(items)
    assert predicted.placement("recent") == placed["recent"]
    assert predicted.placement("ahead") == placed["ahead"]


def test_a_binding_that_confirms_a_guess_counts_from_the_binding() -> None:
    # Decided (the top choice, a guess) at t=0, bound on that node at t=290 (held in PreBind by
    # a volume, say): the TTL and the settling run from the binding, not from the guess. A
    # placement bound and seen bound again keeps its first time.
    static = np.array([np.nan])  # a static profile: only the TTL expires placements
    ledger = PredictedLoad(ttl_seconds=300, settle_seconds=30)
    ledger.record("p", "a", 4.0, 0.0, 0.0, confirmed=False)
    ledger.record("p", "a", 4.0, 0.0, 290.0, confirmed=True)
    assert ledger.per_row({"a": 0}, static, 301.0).cores[0] == 4.0
    assert ledger.per_row({"a": 0}, np.array([300.0]), 301.0).cores[0] == 4.0  # measured 10 s after
    ledger.record("p", "a", 4.0, 0.0, 295.0, confirmed=True)  # the watch sees the same binding
    assert ledger.placement("p").at == 290.0
    assert ledger.per_row({"a": 0}, static, 591.0).cores[0] == 0.0  # the TTL from the binding


def test_a_pod_the_watch_sees_finish_leaves_the_ledger_and_a_listing_agrees() -> None:
    # A pod placed seconds ago that has already finished (a short job) holds no CPU: the watch
    # takes it off the ledger when it sees the phase change, not at the TTL, and a listing
    # after a broken watch takes off one that finished in the gap, as a fresh replica, which
    # never records it, would have it.
    from joulesched.extender.kube import PodBindingWatch

    def pod(phase: str) -> dict:
        return {
            "metadata": {"uid": "job-1", "name": "job-1", "namespace": "d"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "8"}}}]},
            "status": {"phase": phase},
        }

    index, updated = {"n1": 0}, np.array([np.nan])  # a static profile: no measurement settles it
    for phase in ("Succeeded", "Failed"):
        predicted = PredictedLoad(ttl_seconds=300, settle_seconds=30)
        watch = PodBindingWatch("", predicted, clock=lambda: 1000.0)
        watch.handle("ADDED", pod("Running"))
        assert predicted.per_row(index, updated, 1001.0).cores[0] == 8.0
        watch.handle("MODIFIED", pod(phase))
        assert predicted.placement("job-1") is None
        assert predicted.per_row(index, updated, 1001.0).cores[0] == 0.0
        watch.handle("MODIFIED", pod(phase))  # its later updates do not bring it back
        assert predicted.placement("job-1") is None

    running = PredictedLoad(ttl_seconds=300, settle_seconds=30)
    watch = PodBindingWatch("", running, clock=lambda: 1000.0)
    watch.handle("ADDED", pod("Running"))
    watch.record_listed([pod("Succeeded")])  # the watch broke off and lists again
    fresh = PredictedLoad(ttl_seconds=300, settle_seconds=30)
    PodBindingWatch("", fresh, clock=lambda: 1000.0).record_listed([pod("Succeeded")])
    assert running.placement("job-1") is None and fresh.placement("job-1") is None


def test_the_pod_watch_keeps_the_demand_of_the_placement_recorded_for_the_node_it_sees_bound() -> None:
    # The bind verb recorded each pod with its decision's demand (the owner's observed CPU,
    # here a quarter core where the pod requests 4). The watch, seeing the pod bound to that
    # node, confirms the placement without overwriting that demand with the requests. A pod
    # recorded without cores (its decision made on the other replica) takes its requests, and
    # so does one bound to another node than the one recorded.
    from joulesched.extender.kube import PodBindingWatch

    predicted = PredictedLoad(300, 30)
    watch = PodBindingWatch("", predicted, clock=lambda: 1000.0)

    def pod(uid: str, node: str) -> dict:
        return {
            "metadata": {"uid": uid, "name": uid, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": "4"}}}]},
        }

    predicted.record("observed", "n1", 0.25, 0.0, 990.0, confirmed=False)
    predicted.record("other-replica", "n1", 0.0, 0.0, 990.0, confirmed=False)
    predicted.record("moved", "n1", 0.25, 0.0, 990.0, confirmed=False)
    for uid, node in (("observed", "n1"), ("other-replica", "n1"), ("moved", "n2")):
        watch.handle("ADDED", pod(uid, node))
    want = {"observed": ("n1", 0.25, True), "other-replica": ("n1", 4.0, True), "moved": ("n2", 4.0, True)}
    placed = {uid: predicted.placement(uid) for uid in want}
    assert {uid: (p.node, p.cores, p.confirmed) for uid, p in placed.items() if p is not None} == want
    # The watch lists again (every watch ends; the API server's after 5 minutes): the same.
    listed = [pod(uid, node) for uid, (node, _, _) in want.items()]
    for item in listed:
        item["metadata"]["creationTimestamp"] = "1970-01-01T00:16:30Z"  # 990 s: within the TTL
    watch.record_listed(listed)
    placed = {uid: predicted.placement(uid) for uid in want}
    assert {uid: (p.node, p.cores, p.confirmed) for uid, p in placed.items() if p is not None} == want


def test_the_age_heap_stays_within_twice_the_live_placements_without_decisions() -> None:
    # A standby replica only watches pods: nothing calls per_row, whose pass over the ledger
    # rebuilds the heap the TTL expires from. Short-lived pods, each bound and deleted, must
    # not leave an entry each behind; the oldest placement stays the one eviction finds.
    ledger = PredictedLoad(ttl_seconds=120, settle_seconds=30, max_pods=1000)
    for i in range(20_000):
        ledger.record(f"short-{i}", "n1", 1.0, 0.0, float(i), confirmed=True)
        ledger.record(f"short-{i}", "n2", 1.0, 0.0, i + 0.5, confirmed=True)  # moved once
        ledger.forget(f"short-{i}")
    for i in range(1000):
        ledger.record(f"long-{i}", "n1", 1.0, 0.0, 20_000.0 + i, confirmed=True)
    assert len(ledger) == 1000
    assert len(ledger._by_age) <= 2 * 1000 + 1024 + 1
    ledger.record("one-more", "n1", 1.0, 0.0, 30_000.0, confirmed=True)  # the ledger is full
    assert len(ledger) == 1000 and ledger.placement("long-0") is None and ledger.placement("long-1") is not None


def test_a_measurement_stamped_ahead_of_now_does_not_expire_placements() -> None:
    # The node's last measurement carries a time a minute ahead of the extender's clock (the
    # two clocks disagree): it cannot show a pod placed now, which stays predicted on its node.
    index = {"a": 0}
    ledger = PredictedLoad(ttl_seconds=300, settle_seconds=30)
    updated = np.array([1060.0])
    ledger.per_row(index, updated, 1000.0)
    ledger.record("x", "a", 2.0, 0.0, 1000.0, confirmed=True)
    assert ledger._cached is not None  # counted as it is recorded, not by a pass over the ledger
    assert ledger.per_row(index, updated, 1001.0).cores.tolist() == [2.0]
    assert ledger.placement("x") is not None
    # Once the clock has passed it, it is a measurement like any other: the same profiles
    # read again, or new ones with the same time, alike.
    assert ledger.per_row(index, updated, 1061.0).cores.tolist() == [0.0]
    assert ledger.placement("x") is None
    ledger.record("y", "a", 2.0, 0.0, 1000.0, confirmed=True)
    assert ledger.per_row(index, np.array([1060.0]), 1061.0).cores.tolist() == [0.0]


def test_the_load_and_the_pods_own_placement_are_read_together() -> None:
    # Another thread (the pod watch, the bind verb, a retried filter) moves the pod to "b"
    # just after the load is read. The placement handed back with that load is the one it
    # counted, on "a": taken off, it leaves "a" empty and the other pod's cores on "b" whole.
    # (Read apart, the pod's placement on "b", never counted, took the other pod's off.)
    index, updated = {"a": 0, "b": 1}, np.array([np.nan, np.nan])

    class ReleaseHook:
        """The ledger's lock, running a step once, just after the next release."""

        def __init__(self) -> None:
            self.inner = threading.Lock()
            self.after_release: Callable[[], None] | None = None

        def __enter__(self) -> None:
            self.inner.acquire()

        def __exit__(self, *_: object) -> None:
            self.inner.release()
            step, self.after_release = self.after_release, None
            if step is not None:
                step()

    class MovedMeanwhile(PredictedLoad):
        def _per_row(self, *args: Any) -> RowLoad:
            self._lock.after_release = lambda: self.record("me", "b", 0.5, 0.0, 101.0, confirmed=True)
            return super()._per_row(*args)

    ledger = MovedMeanwhile(300, 30)
    ledger._lock = ReleaseHook()  # type: ignore[assignment]
    ledger.record("other", "b", 3.0, 0.0, 100.0, confirmed=True)
    ledger.record("me", "a", 0.5, 0.0, 100.0, confirmed=False)
    load, own = ledger.per_row_and_own(index, updated, 101.0, "me")
    assert own is not None and own.node == "a"
    left = load.without(index[own.node], own)
    assert (left.cores.tolist(), left.pods.tolist()) == ([0.0, 3.0], [0, 1])
    assert ledger.placement("me").node == "b"  # type: ignore[union-attr]  # the move went through after

    plain = PredictedLoad(300, 30)
    assert plain.per_row_and_own(index, updated, 101.0, "nobody")[1] is None
    plain.record("elsewhere", "z", 1.0, 0.0, 100.0, confirmed=True)  # a node with no profile: not counted
    assert plain.per_row_and_own(index, updated, 101.0, "elsewhere")[1] is None
