"""joulesched's extender (the real gunicorn server) driven by the real kube-scheduler.

Every scheduler here uses the extender entry of deploy/scheduler/scheduler-config.yaml as it
is (weight, httpTimeout, nodeCacheCapable, ignorable, verbs) with only ``urlPrefix`` pointed
at the local extender, and the extender runs deploy/extender/config.yaml's policy with a
``file`` profile source describing the test's nodes. Each test labels its nodes and selects
them with a nodeSelector, so nothing else in the session-wide cluster takes part.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
from e2e_extender import (
    EFFICIENT_CURVE,
    INEFFICIENT_CURVE,
    HoldingRelay,
    deploy_extender_config,
    deploy_extender_entry,
    energy_scheduler_config,
    node_profile,
    placements,
    stays_pending,
    wait_all_bound,
)
from processes import ClusterError, _wait_until

SITE = {"dc": {"pue": 1.2, "carbon_intensity": 300}}  # one site: only energy differs


def uid_tag() -> str:
    return uuid.uuid4().hex[:6]


# --------------------------------------------------------------------------
# 1. pods land where the policy says
# --------------------------------------------------------------------------

@pytest.mark.parametrize("node_cache_capable", [True, False],
                         ids=["nodeCacheCapable-true", "nodeCacheCapable-false"])
def test_energy_aware_scheduler_prefers_efficient_nodes(
        control_plane, node_factory, scheduler_factory, extender_factory, e2e_namespace,
        node_cache_capable):
    cp, ns, tag = control_plane, e2e_namespace, uid_tag()
    sel = {"e2e-test": f"policy-{tag}"}
    eff = [f"eff-{tag}-{i}" for i in range(2)]
    ineff = [f"ineff-{tag}-{i}" for i in range(2)]
    # In-tree scoring alone prefers the inefficient type: it is bigger (more free room
    # for NodeResourcesFit's LeastAllocated and a better BalancedAllocation).
    for n in eff:
        node_factory(n, cpu="64", memory="128Gi", labels=sel)
    for n in ineff:
        node_factory(n, cpu="80", memory="512Gi", labels=sel)
    # Every node already runs other work (30 %). On an idle node the first pod would pay the
    # steep idle-to-10 % step of the curve (56.8 -> 100 W), and whether the two default-scheduled
    # pods below count as predicted load on the inefficient nodes depends on when the extender's
    # pod watch starts: from idle, the policy would rightly prefer an inefficient node that
    # already left idle.
    profiles = {"sites": SITE, "nodes": (
        [node_profile(n, EFFICIENT_CURVE, 64, site="dc", utilisation=0.3) for n in eff]
        + [node_profile(n, INEFFICIENT_CURVE, 80, site="dc", utilisation=0.3) for n in ineff])}
    ext = extender_factory(profiles, deploy_extender_config(cp.kubeconfig))

    energy_name = f"joule-{tag}"
    entry = deploy_extender_entry(ext.url)
    assert entry["weight"] == 5 and entry["httpTimeout"] == "1s"  # the manifest's values
    energy = scheduler_factory(
        energy_scheduler_config(energy_name, ext.url, nodeCacheCapable=node_cache_capable),
        name=energy_name, verbosity=2)
    assert energy.config["extenders"][0]["weight"] == entry["weight"]
    default = scheduler_factory(None, name=f"default-{tag}")
    assert default.scheduler_names == ["default-scheduler"]

    # The default scheduler: the extender is never asked, and the pods go where in-tree
    # scoring puts them -- the big, inefficient nodes.
    before = ext.requests()
    plain = [f"plain-{i}" for i in range(2)]
    for p in plain:
        cp.create_pod(p, ns, cpu="8", memory="1Gi", node_selector=sel)
    plain_nodes = wait_all_bound(cp, ns, plain, timeout=30)
    assert ext.requests() == before, "the default scheduler consulted the extender"
    assert set(plain_nodes.values()) <= set(ineff), (
        f"in-tree scores alone should prefer the inefficient nodes: {plain_nodes}")

    # The energy-aware scheduler: every pod on an efficient node.
    # Four 4-core pods: each efficient node ends at 42.5 %, where its next 4 cores still cost
    # less (11.9 W) than 4 cores on an inefficient node at 30 % (14 W). More load would
    # rightly tip the balance: the efficient curve steepens at 50-60 %.
    aware = [f"aware-{i}" for i in range(4)]
    for p in aware:
        cp.create_pod(p, ns, scheduler_name=energy_name, cpu="4", memory="1Gi",
                      node_selector=sel)
    aware_nodes = wait_all_bound(cp, ns, aware, timeout=60)
    assert set(aware_nodes.values()) <= set(eff), (
        f"pods not on efficient nodes: {aware_nodes}\nscheduler log:\n{energy.log_tail(30)}"
        f"\nextender log:\n{ext.log_tail(30)}")
    assert ext.requests("filter", "200") >= len(aware)
    assert ext.requests("prioritize", "200") >= len(aware)
    assert ext.failures() == 0, ext.samples()
    assert ext.requests() - ext.requests(code="200") == 0
    assert "Skipping extender" not in energy.log_text()


# --------------------------------------------------------------------------
# 2. the power cap filter
# --------------------------------------------------------------------------

@pytest.mark.parametrize("node_cache_capable", [True, False],
                         ids=["nodeCacheCapable-true", "nodeCacheCapable-false"])
def test_power_cap_filter(control_plane, node_factory, scheduler_factory, extender_factory,
                          e2e_namespace, node_cache_capable):
    # Full Nodes: the filter echoes the one passing node as the bytes kube-scheduler sent.
    cp, ns, tag = control_plane, e2e_namespace, uid_tag()
    sel = {"e2e-test": f"cap-{tag}"}
    hot, cool = f"hot-{tag}", f"cool-{tag}"
    node_factory(hot, cpu="64", memory="256Gi", labels=sel)
    node_factory(cool, cpu="80", memory="256Gi", labels=sel)
    profiles = {"sites": SITE, "nodes": [
        # Efficient and busy, 3.75 W under its cap less the 5 % headroom: a 4-core pod
        # (+11 W) does not fit under it.
        node_profile(hot, EFFICIENT_CURVE, 64, site="dc", utilisation=0.9,
                     measured_watts=248, power_cap_watts=265),
        # Inefficient but with room: 475 W allowed, 200 W now.
        node_profile(cool, INEFFICIENT_CURVE, 80, site="dc", utilisation=0.1,
                     measured_watts=200, power_cap_watts=500),
    ]}
    ext = extender_factory(profiles, deploy_extender_config(cp.kubeconfig))
    name = f"joule-cap-{tag}"
    sched = scheduler_factory(
        energy_scheduler_config(name, ext.url, nodeCacheCapable=node_cache_capable), name=name)

    # Without the cap the hot node would be the cheaper place (it would win the score).
    probe = {"Pod": {"metadata": {"name": "probe", "namespace": ns, "uid": "probe"},
                     "spec": {"containers": [{"name": "c", "resources": {
                         "requests": {"cpu": "4"}}}]}},
             "NodeNames": [hot, cool]}
    status, why = ext.post("explain", probe)
    assert status == 200, why
    by_node = {n["node"]: n for n in why["nodes"]}
    assert by_node[hot]["estimate"]["cost"] < by_node[cool]["estimate"]["cost"], why
    assert by_node[hot]["filtered"].startswith("power cap"), why
    assert "filtered" not in by_node[cool], why

    small = [f"small-{i}" for i in range(3)]
    for p in small:
        cp.create_pod(p, ns, scheduler_name=name, cpu="4", memory="1Gi", node_selector=sel)
    placed = wait_all_bound(cp, ns, small, timeout=30)
    assert set(placed.values()) == {cool}, placed
    assert ext.metric("joulesched_extender_filtered_nodes_total", reason="power_cap") >= 3

    # A pod too big for either node's cap: Pending, with our reason in FailedScheduling.
    cp.create_pod("big", ns, scheduler_name=name, cpu="60", memory="1Gi", node_selector=sel)
    event = cp.wait_for_failed_scheduling("big", ns, timeout=30)
    assert "joulesched: power cap" in event.message, event.message
    assert event.message.startswith("0/"), event.message
    assert stays_pending(cp, ns, "big", 3), "a pod over every cap was bound"
    assert "Skipping extender" not in sched.log_text()  # a filter verdict, not an error


# --------------------------------------------------------------------------
# 3. the bind verb
# --------------------------------------------------------------------------

def test_bind_verb(control_plane, node_factory, scheduler_factory, extender_factory,
                   e2e_namespace):
    cp, ns, tag = control_plane, e2e_namespace, uid_tag()
    sel = {"e2e-test": f"bind-{tag}"}
    nodes = [f"bind-{tag}-{i}" for i in range(2)]
    for n in nodes:
        node_factory(n, cpu="64", memory="128Gi", labels=sel)
    profiles = {"sites": SITE, "nodes": [node_profile(n, EFFICIENT_CURVE, 64, site="dc")
                                         for n in nodes]}
    ext = extender_factory(profiles, deploy_extender_config(
        cp.kubeconfig, bind={"enabled": True}))
    name = f"joule-bind-{tag}"
    # -v=3 logs the in-tree DefaultBinder's "Attempting to bind pod to node".
    sched = scheduler_factory(energy_scheduler_config(name, ext.url, bindVerb="bind"),
                              name=name, verbosity=3)

    pods = [f"bound-{i}" for i in range(3)]
    for p in pods:
        cp.create_pod(p, ns, scheduler_name=name, cpu="1", memory="1Gi", node_selector=sel)
    placed = wait_all_bound(cp, ns, pods, timeout=30)
    assert set(placed.values()) <= set(nodes)
    # The Binding is visible before the worker has counted the reply: wait for the count, then
    # check it is exactly one bind per pod.
    try:
        _wait_until(lambda: ext.requests("bind", "200") >= len(pods), timeout=10, what="the bind replies counted")
    except ClusterError:
        pass
    assert ext.requests("bind", "200") == len(pods), ext.samples()
    assert ext.failures() == 0, ext.samples()
    log = sched.log_text()
    assert "Skipping extender in bind" not in log, log[-3000:]
    assert "Attempting to bind pod to node" not in log, "the scheduler bound a pod itself"
    assert " failed: " not in ext.log_text(), ext.log_tail()  # Extender.bind's warning
    for p in pods:
        assert cp.pod_events(p, ns, "Scheduled"), f"no Scheduled event for {p}"


def test_bindings_waiting_on_a_stalled_api_server_hold_no_decision_thread(
        control_plane, node_factory, extender_factory, e2e_namespace):
    # kube-scheduler sends each pod's bind as soon as the pod is placed, from a goroutine of its
    # own, so with the API server slow to answer many bindings are in flight at once, each
    # holding a thread of the extender until its answer comes. They have threads of their own
    # (bind.threads): the next pod's filter is answered within kube-scheduler's httpTimeout
    # (deploy/: 1 s) while six bindings wait on a stopped kube-apiserver, with two
    # server.threads that six bindings in one pool would all take.
    cp, ns, tag = control_plane, e2e_namespace, uid_tag()
    node = f"stall-{tag}"
    node_factory(node, cpu="64", memory="128Gi")
    profiles = {"sites": SITE, "nodes": [node_profile(node, EFFICIENT_CURVE, 64, site="dc")]}
    ext = extender_factory(profiles, deploy_extender_config(
        cp.kubeconfig, bind={"enabled": True, "threads": 8}, server={"threads": 2}))
    pods = [f"stalled-{i}" for i in range(7)]
    uids = {p: cp.create_pod(p, ns, scheduler_name=f"nobody-{tag}", cpu="1").metadata.uid for p in pods}

    def bind(pod: str) -> tuple[int, Any]:
        return ext.post("bind", {"PodName": pod, "PodNamespace": ns, "PodUID": uids[pod], "Node": node})

    assert bind(pods[0]) == (200, {"Error": ""})  # the binder's API client made, its connection open
    filter_body = {"Pod": {"metadata": {"name": "next", "namespace": ns, "uid": f"next-{tag}"},
                           "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}},
                   "NodeNames": [node]}
    stall = 2.5
    with ThreadPoolExecutor(len(pods) - 1) as pool:
        os.kill(cp.apiserver.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            binds = [pool.submit(bind, p) for p in pods[1:]]
            _wait_until(lambda: ext.metric("joulesched_extender_binds_in_flight") == len(binds), timeout=2,
                        what="every binding sent and waiting on the API server")
            assert not any(b.done() for b in binds), [b.result() for b in binds if b.done()]
            started = time.monotonic()
            status, reply = ext.post("filter", filter_body)
            took = time.monotonic() - started
            waiting = sum(not b.done() for b in binds)
        finally:
            time.sleep(max(0.0, stopped + stall - time.monotonic()))
            os.kill(cp.apiserver.pid, signal.SIGCONT)
        answers = [b.result(timeout=30) for b in binds]
    assert status == 200 and reply["NodeNames"] == [node], reply
    assert took < 1.0, f"the filter took {took:.2f} s behind the bindings"
    assert waiting == len(binds), "a binding was answered while the API server was stopped"
    assert answers == [(200, {"Error": ""})] * len(binds), answers
    assert set(placements(cp, ns, pods).values()) == {node}
    assert ext.metric("joulesched_extender_binds_in_flight") == 0


def test_a_bind_kube_scheduler_gave_up_on_is_not_sent(
        control_plane, node_factory, scheduler_factory, extender_factory, e2e_namespace, tmp_path):
    # kube-scheduler gives up on a bind after its httpTimeout (deploy/: 1 s), closes the
    # connection and, the extender being ignorable, binds the pod itself. Binds still queued
    # for the extender's bind thread then are not sent: they would reach the API server after
    # kube-scheduler had bound the pod (or, not ignorable, let the node go). Here the extender's
    # API writes are held in a relay while the real kube-scheduler places four pods; the one
    # bind thread holds the first binding, the other three wait, and kube-scheduler gives up
    # on all four. Released, the first binding (sent before kube-scheduler gave up) comes back
    # 409; the other three are counted as 499 and never sent.
    cp, ns, tag = control_plane, e2e_namespace, uid_tag()
    sel = {"e2e-test": f"gaveup-{tag}"}
    node = f"gaveup-{tag}"
    node_factory(node, cpu="64", memory="128Gi", labels=sel)
    profiles = {"sites": SITE, "nodes": [node_profile(node, EFFICIENT_CURVE, 64, site="dc")]}
    relay = HoldingRelay(cp.server)
    try:
        kubeconfig = relay.kubeconfig(cp.kubeconfig, tmp_path / "relayed.kubeconfig")
        ext = extender_factory(profiles, deploy_extender_config(
            kubeconfig, bind={"enabled": True, "threads": 1, "wait_seconds": 0}))
        name = f"joule-gaveup-{tag}"
        sched = scheduler_factory(energy_scheduler_config(name, ext.url, bindVerb="bind"), name=name, verbosity=3)
        cp.create_pod("first", ns, scheduler_name=name, cpu="1", memory="1Gi", node_selector=sel)
        wait_all_bound(cp, ns, ["first"], timeout=30)  # through the extender: its API connection open
        _wait_until(lambda: ext.requests("bind", "200") >= 1, timeout=10, what="the first bind counted")
        relay.hold()
        pods = [f"late-{i}" for i in range(4)]
        for p in pods:
            cp.create_pod(p, ns, scheduler_name=name, cpu="1", memory="1Gi", node_selector=sel)
        placed = wait_all_bound(cp, ns, pods, timeout=30)  # by kube-scheduler itself
        relay.release()
        _wait_until(lambda: ext.requests("bind") >= 1 + len(pods), timeout=10, what="every bind counted")
    finally:
        relay.close()
    assert set(placed.values()) == {node}
    assert sched.log_text().count("Skipping extender in bind") == len(pods)
    assert ext.requests("bind", "499") == len(pods) - 1, ext.samples()
    assert ext.failures("bind", "client_gone") == len(pods) - 1
    failed = [line for line in ext.log_text().splitlines() if " failed: " in line]
    # The one in flight: already assigned, or (on a machine that took over the binder's 5 s to
    # bind the four itself) timed out; either way the only binding the API server was sent.
    assert len(failed) == 1 and ("409" in failed[0] or "timed out" in failed[0]), failed


def test_the_binder_binds_and_names_the_apis_refusals(control_plane, node_factory, e2e_namespace):
    # extender.kube.Binder posts the Binding itself through the client's pool and credentials:
    # against the real kube-apiserver it binds, and each refusal comes back with the API's words.
    from joulesched.extender.errors import ExtenderError
    from joulesched.extender.kube import Binder
    from joulesched.extender.wire import BindingArgs

    cp, ns, tag = control_plane, e2e_namespace, uid_tag()
    node = f"binder-{tag}"
    node_factory(node, cpu="8", memory="8Gi")
    for p in ("a", "b"):
        cp.create_pod(f"{p}-{tag}", ns, scheduler_name="nobody", cpu="100m", memory="64Mi")
    uid = cp.core.read_namespaced_pod(f"a-{tag}", ns).metadata.uid
    binder = Binder(str(cp.kubeconfig))
    binder(BindingArgs(f"a-{tag}", ns, uid, node))
    assert cp.pod_node(f"a-{tag}", ns) == node
    with pytest.raises(ExtenderError, match=r"HTTP 409: .*already assigned"):
        binder(BindingArgs(f"a-{tag}", ns, uid, node))
    with pytest.raises(ExtenderError, match=r"HTTP 409: .*(UID|uid|Precondition)"):
        binder(BindingArgs(f"b-{tag}", ns, "00000000-0000-0000-0000-000000000000", node))
    with pytest.raises(ExtenderError, match=r"HTTP 404: .*not found"):
        binder(BindingArgs(f"missing-{tag}", ns, "", node))
    assert not cp.pod_node(f"b-{tag}", ns)
    # An identity without create on pods/binding (deploy/'s RBAC grants it) is refused, named.
    stranger = Binder(str(cp.client_kubeconfig(f"stranger-{tag}")))
    with pytest.raises(ExtenderError, match=rf'HTTP 403: .*User "stranger-{tag}" cannot create resource "pods/binding"'):
        stranger(BindingArgs(f"b-{tag}", ns, "", node))
    # A bearer token (in-cluster, the extender's ServiceAccount) is sent too: named in the refusal.
    cp.core.create_namespaced_service_account(ns, {"metadata": {"name": f"sa-{tag}"}})
    bearer = Binder(str(cp.service_account_kubeconfig(ns, f"sa-{tag}")))
    with pytest.raises(ExtenderError, match=rf"HTTP 403: .*system:serviceaccount:{ns}:sa-{tag}.*pods/binding"):
        bearer(BindingArgs(f"b-{tag}", ns, "", node))


def test_the_node_watch_follows_the_server_id_label(control_plane, node_factory):
    # extender.kube.NodeServerWatch against the real API: the list, then the watch with the same
    # label selector, so a node that loses its label comes as DELETED and leaves the map.
    from joulesched.extender.kube import NodeServerWatch

    cp, tag = control_plane, uid_tag()
    label = f"e2e.joulesched.io/server-{tag}"

    holder = SimpleNamespace(node_servers={})  # the Extender's attribute the watch replaces
    node_factory(f"vm-a-{tag}", cpu="8", memory="8Gi", labels={label: "srv-1"})
    node_factory(f"vm-b-{tag}", cpu="8", memory="8Gi", labels={})
    watch = NodeServerWatch(str(cp.kubeconfig), label, holder)
    watch.start()
    try:
        _wait_until(lambda: holder.node_servers == {f"vm-a-{tag}": "srv-1"}, 30, what="the node map after the listing")
        cp.core.patch_node(f"vm-b-{tag}", {"metadata": {"labels": {label: "srv-2"}}})
        _wait_until(lambda: holder.node_servers.get(f"vm-b-{tag}") == "srv-2", 30, what="the node map after a label added")
        cp.core.patch_node(f"vm-a-{tag}", {"metadata": {"labels": {label: "srv-3"}}})
        _wait_until(lambda: holder.node_servers.get(f"vm-a-{tag}") == "srv-3", 30, what="the node map after a label changed")
        cp.core.patch_node(f"vm-a-{tag}", {"metadata": {"labels": {label: None}}})
        _wait_until(lambda: f"vm-a-{tag}" not in holder.node_servers, 30, what="the node map after a label removed")
        node_factory(f"vm-c-{tag}", cpu="8", memory="8Gi", labels={label: "srv-1"})
        _wait_until(lambda: holder.node_servers == {f"vm-b-{tag}": "srv-2", f"vm-c-{tag}": "srv-1"}, 30,
                    what="the node map after a node added")
        cp.delete_node(f"vm-c-{tag}")
        _wait_until(lambda: holder.node_servers == {f"vm-b-{tag}": "srv-2"}, 30, what="the node map after a node deleted")
    finally:
        watch.stop()


def test_the_pod_watch_records_bindings_and_forgets_deleted_pods(control_plane, node_factory, e2e_namespace):
    # extender.kube.PodBindingWatch against the real API: a pod bound by someone else enters the
    # ledger as confirmed with its requests, a pod still pending does not (its events never reach
    # the watch), a deleted one leaves; a pod bound before the watch listed is recorded at the
    # time the API server bound it.
    from joulesched.extender.kube import Binder, PodBindingWatch
    from joulesched.extender.predicted import PredictedLoad
    from joulesched.extender.wire import BindingArgs

    cp, ns, tag = control_plane, e2e_namespace, uid_tag()
    node = f"watched-{tag}"
    node_factory(node, cpu="8", memory="8Gi")
    predicted = PredictedLoad(ttl_seconds=3600, settle_seconds=3600)
    watch = PodBindingWatch(str(cp.kubeconfig), predicted)
    seen: list[tuple[str, str]] = []  # the events that reached the watch, for this test's pods
    handle = watch.handle

    def counting(kind: str, pod: dict) -> None:
        if pod["metadata"]["name"].endswith(tag):
            seen.append((kind, pod["metadata"]["name"]))
        handle(kind, pod)

    watch.handle = counting  # type: ignore[method-assign]
    cp.create_pod(f"early-{tag}", ns, scheduler_name="nobody", cpu="750m", memory="64Mi")
    early = cp.core.read_namespaced_pod(f"early-{tag}", ns).metadata.uid
    before = time.time()
    Binder(str(cp.kubeconfig))(BindingArgs(f"early-{tag}", ns, early, node))
    watch.start()
    try:
        # The listing: a pod bound moments before it is load no measurement shows yet, recorded
        # at its binding time (PodScheduled's lastTransitionTime, to the second).
        assert watch.listed.wait(30), "the pod watch never listed"
        placed = predicted.placement(early)
        assert placed is not None and (placed.node, placed.cores, placed.confirmed) == (node, 0.75, True)
        assert int(before) <= placed.at <= time.time(), (before, placed.at)
        uids = {}
        for p, cpu in (("a", "1500m"), ("b", "250m")):
            cp.create_pod(f"{p}-{tag}", ns, scheduler_name="nobody", cpu=cpu, memory="64Mi")
            uids[p] = cp.core.read_namespaced_pod(f"{p}-{tag}", ns).metadata.uid
        Binder(str(cp.kubeconfig))(BindingArgs(f"a-{tag}", ns, uids["a"], node))
        _wait_until(lambda: predicted.placement(uids["a"]) is not None, 30, what="the binding seen")
        placed = predicted.placement(uids["a"])
        assert placed is not None and (placed.node, placed.cores, placed.confirmed) == (node, 1.5, True)
        assert predicted.placement(uids["b"]) is None  # pending: nothing to record
        cp.core.delete_namespaced_pod(f"a-{tag}", ns, grace_period_seconds=0)
        _wait_until(lambda: predicted.placement(uids["a"]) is None, 30, what="the deletion seen")
        # The API server filters with the watch's selector: nothing of the pending pod, and the
        # bound one enters as ADDED, not as a MODIFIED of a pod never seen (its deletion sets
        # deletionTimestamp first: a MODIFIED, then the DELETED).
        assert {name for _, name in seen} == {f"a-{tag}"}, seen  # the early pod came with the listing
        assert (seen[0][0], seen[-1][0]) == ("ADDED", "DELETED"), seen
    finally:
        watch.stop()


def test_the_pod_watch_resumes_from_its_last_resource_version_when_the_api_server_ends_it(
        control_plane, node_factory, e2e_namespace):
    # kube-apiserver ends every watch at its timeoutSeconds (4 s here, 300 s as shipped). The
    # next watch resumes from the last resourceVersion seen, an event's or a BOOKMARK's, without
    # listing again (a listing of every bound pod in the cluster, each replica, every 300 s);
    # a binding and a deletion made while no watch is open still arrive, and the BOOKMARKs keep
    # that resourceVersion recent while nothing matches the watch's selector.
    from joulesched.extender.kube import Binder, PodBindingWatch
    from joulesched.extender.predicted import PredictedLoad
    from joulesched.extender.wire import BindingArgs

    cp, ns, tag = control_plane, e2e_namespace, uid_tag()
    node = f"resumed-{tag}"
    node_factory(node, cpu="8", memory="8Gi")
    predicted = PredictedLoad(ttl_seconds=3600, settle_seconds=3600)
    watch = PodBindingWatch(str(cp.kubeconfig), predicted)
    watch.watch_seconds = 4  # kube-apiserver sends its BOOKMARK 2 s before a watch's end
    watch.HELD_SECONDS = 3  # a watch that lasted its 4 s held: the next starts at once
    watched: list[tuple[float, str]] = []  # when each watch began, and from which resourceVersion
    kinds: list[str] = []
    listed_version: list[str] = []
    watch_from, list_from = watch._watch, watch._list

    def watching(version: str):
        watched.append((time.monotonic(), version))
        for kind, obj in watch_from(version):
            kinds.append(kind)
            yield kind, obj

    def listing() -> str:
        listed_version.append(list_from())
        return listed_version[-1]

    watch._watch, watch._list = watching, listing  # type: ignore[method-assign]
    uids = {}
    for p in ("a", "b"):
        cp.create_pod(f"{p}-{tag}", ns, scheduler_name="nobody", cpu="500m", memory="64Mi")
        uids[p] = cp.core.read_namespaced_pod(f"{p}-{tag}", ns).metadata.uid
    watch.start()
    try:
        assert watch.listed.wait(30), "the pod watch never listed"
        Binder(str(cp.kubeconfig))(BindingArgs(f"a-{tag}", ns, uids["a"], node))
        _wait_until(lambda: predicted.placement(uids["a"]) is not None, 30, what="a's binding seen")
        # Pending pods (no match for the selector) move the store's resourceVersion on: only a
        # BOOKMARK can bring the watches' resourceVersion up to the last one's.
        pending = [cp.create_pod(f"pending-{i}-{tag}", ns, scheduler_name="nobody", cpu="10m", memory="8Mi")
                   for i in range(5)]
        last_pending = int(pending[-1].metadata.resource_version)
        _wait_until(lambda: int(watched[-1][1]) >= last_pending, 30, what="a watch from after the pending pods")
        # Between two watches: the next one replays what happened from its resourceVersion on.
        ended = len(watched)
        _wait_until(lambda: len(watched) > ended, 30, what="another watch")
        cp.core.delete_namespaced_pod(f"a-{tag}", ns, grace_period_seconds=0)
        Binder(str(cp.kubeconfig))(BindingArgs(f"b-{tag}", ns, uids["b"], node))
        _wait_until(lambda: predicted.placement(uids["a"]) is None, 30, what="a's deletion seen")
        _wait_until(lambda: predicted.placement(uids["b"]) is not None, 30, what="b's binding seen")
        _wait_until(lambda: len(watched) >= ended + 2, 30, what="more watches ended by the API server")
    finally:
        watch.stop()
    assert watch.lists == 1 and len(listed_version) == 1, (watch.lists, listed_version)
    versions = [int(v) for _, v in watched]
    assert versions[0] == int(listed_version[0]) and versions == sorted(versions), versions
    assert "BOOKMARK" in kinds, kinds  # asked for, and sent
    # Each watch after the first began where the last left off, and at once.
    assert all(b - a < 4 + 1.5 for (a, _), (b, _) in itertools.pairwise(watched)), watched


def test_the_pod_watch_listing_again_after_a_break_forgets_the_pods_deleted_in_it(
        control_plane, node_factory, e2e_namespace, tmp_path):
    # The pod watch reaches the real API through a relay, which is cut: while it is, a pod the
    # watch had seen bound is deleted and another is bound. Listing again once the relay is
    # back, the ledger drops the first, as the DELETED it never saw would have, records the
    # second, and a decision waiting for the second's binding stops waiting.
    from joulesched.extender.kube import Binder, PodBindingWatch
    from joulesched.extender.predicted import PredictedLoad, Unbound
    from joulesched.extender.wire import BindingArgs

    cp, ns, tag = control_plane, e2e_namespace, uid_tag()
    node = f"relisted-{tag}"
    node_factory(node, cpu="8", memory="8Gi")
    uids = {}
    for p, cpu in (("gone", "1500m"), ("new", "250m")):
        cp.create_pod(f"{p}-{tag}", ns, scheduler_name="nobody", cpu=cpu, memory="64Mi")
        uids[p] = cp.core.read_namespaced_pod(f"{p}-{tag}", ns).metadata.uid
    Binder(str(cp.kubeconfig))(BindingArgs(f"gone-{tag}", ns, uids["gone"], node))
    relay = HoldingRelay(cp.server)
    predicted = PredictedLoad(ttl_seconds=3600, settle_seconds=3600)
    unbound = Unbound(wait_seconds=30)
    watch = PodBindingWatch(str(relay.kubeconfig(cp.kubeconfig, tmp_path / "relayed.kubeconfig")),
                            predicted, unbound=unbound)
    watch.start()
    try:
        assert watch.listed.wait(30), "the pod watch never listed"
        placed = predicted.placement(uids["gone"])
        assert placed is not None and (placed.node, placed.cores) == (node, 1.5)
        # This scheduler binds through the bind verb, and "new" was answered here: a decision
        # waits for its binding.
        unbound.decided("before", 0.1, 0.0)
        unbound.bound("before", by_bind_verb=True)
        unbound.decided(uids["new"], 0.25, 0.0)
        relay.cut()
        cp.core.delete_namespaced_pod(f"gone-{tag}", ns, grace_period_seconds=0)
        _wait_until(lambda: f"gone-{tag}" not in placements(cp, ns), 30, what="the pod deleted")
        Binder(str(cp.kubeconfig))(BindingArgs(f"new-{tag}", ns, uids["new"], node))
        time.sleep(1.5)  # the watch's first attempts back find the relay cut (its back-off grows)
        assert predicted.placement(uids["gone"]) is not None  # nothing seen yet
        relay.restore()
        waited = unbound.wait_for_others("next")  # until the listing reports "new" bound
        assert waited < 20, f"waited {waited:.1f} s: the listing did not end the wait"
        assert predicted.placement(uids["gone"]) is None
        placed = predicted.placement(uids["new"])
        assert placed is not None and (placed.node, placed.cores, placed.confirmed) == (node, 0.25, True)
    finally:
        watch.stop()
        relay.close()
