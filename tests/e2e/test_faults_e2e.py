"""What the real kube-scheduler does when the extender is down, slow, or wrong.

The extender entry is deploy/'s (httpTimeout 1s, ignorable true, nodeCacheCapable true,
weight 5) with ``urlPrefix`` pointed at the test's endpoint, and ``ignorable`` overridden
where a test says so. kube-scheduler v1.37.2 (pkg/scheduler/schedule_one.go):

* a **filter** error (connection refused, timeout, non-200, undecodable body, non-empty
  ``Error``) with ``ignorable: true`` skips the extender ("Skipping extender as it returned
  error and has ignorable flag set"); without it the scheduling cycle fails: the pod gets a
  FailedScheduling event with the error and is retried with back-off (1 s doubling to 10 s);
* a **prioritize** error is always ignored (logged at -v=5 only), ignorable or not.

Slow and broken extenders are played by ``e2e_extender.FaultProxy``, a stdlib HTTP server in
the test process placed between kube-scheduler and the real extender: it forwards, or
delays (longer than httpTimeout), or answers HTTP 500 or a non-JSON body. When it is our
extender that refuses a request (a pod with an invalid runtime annotation → HTTP 400), our
own metrics must count it.
"""

from __future__ import annotations

import time
import uuid

import pytest
from e2e_extender import (
    EFFICIENT_CURVE,
    INEFFICIENT_CURVE,
    PASS,
    RUNTIME_ANNOTATION,
    deploy_extender_entry,
    energy_scheduler_config,
    node_profile,
    stays_pending,
)

from joulesched.contracts.net import free_port

SKIPPED = "Skipping extender as it returned error and has ignorable flag set"


def http_timeout_seconds() -> float:
    raw = deploy_extender_entry("http://unused")["httpTimeout"]
    assert raw.endswith("s") and not raw.endswith("ms"), raw
    return float(raw[:-1])


@pytest.fixture
def two_nodes(node_factory):
    """Two labelled nodes (prioritize is only called with more than one feasible node) and
    their profile document; returns (selector, names, profiles)."""
    tag = uuid.uuid4().hex[:6]
    sel = {"e2e-test": f"faults-{tag}"}
    names = [f"f-{tag}-eff", f"f-{tag}-ineff"]
    node_factory(names[0], cpu="64", memory="128Gi", labels=sel)
    node_factory(names[1], cpu="80", memory="128Gi", labels=sel)
    profiles = {"nodes": [node_profile(names[0], EFFICIENT_CURVE, 64),
                          node_profile(names[1], INEFFICIENT_CURVE, 80)]}
    return sel, names, profiles


def binds(cp):
    """The extender config these tests need: deploy/'s entry names the bind verb, so the
    extender serves it (without, each bind is a 404 that only ``ignorable`` forgives)."""
    return {"bind": {"enabled": True}, "kubeconfig": str(cp.kubeconfig)}


def start_energy_scheduler(scheduler_factory, url, ignorable, verbosity=2):
    name = f"faults-{uuid.uuid4().hex[:6]}"
    sched = scheduler_factory(energy_scheduler_config(name, url, ignorable=ignorable),
                              name=name, verbosity=verbosity)
    return name, sched


def assert_waits_then_schedules(cp, ns, pod, fix, *, expect_in_event, proxy=None,
                                retries=2, timeout=40):
    """The pod fails scheduling with ``expect_in_event`` in its FailedScheduling event,
    stays Pending (and, with ``proxy``, is retried at least ``retries`` times), then is
    bound once ``fix()`` has repaired the extender."""
    event = cp.wait_for_failed_scheduling(pod, ns, timeout=30)
    assert expect_in_event in event.message, event.message
    if proxy is not None:
        deadline = time.monotonic() + 20
        while proxy.count("filter") < retries and time.monotonic() < deadline:
            assert not cp.pod_node(pod, ns), "bound while the extender was failing"
            time.sleep(0.2)
        assert proxy.count("filter") >= retries, f"not retried: {proxy.calls}"
    assert stays_pending(cp, ns, pod, 1.5)
    fix()
    return cp.wait_for_pod_scheduled(pod, ns, timeout=timeout)


# --------------------------------------------------------------------------
# extender down
# --------------------------------------------------------------------------

def test_extender_down_ignorable_pods_still_schedule(
        control_plane, scheduler_factory, two_nodes, e2e_namespace):
    sel, names, _ = two_nodes
    url = f"http://127.0.0.1:{free_port()}/scheduler"  # nothing listens there
    name, sched = start_energy_scheduler(scheduler_factory, url, ignorable=True)
    control_plane.create_pod("p", e2e_namespace, scheduler_name=name, cpu="1",
                             node_selector=sel)
    assert control_plane.wait_for_pod_scheduled("p", e2e_namespace, timeout=30) in names
    log = sched.log_text()
    assert SKIPPED in log and "connection refused" in log, sched.log_tail()


def test_extender_down_not_ignorable_pods_wait_then_schedule(
        control_plane, scheduler_factory, extender_factory, two_nodes, e2e_namespace):
    sel, names, profiles = two_nodes
    port = free_port()
    url = f"http://127.0.0.1:{port}/scheduler"
    name, _ = start_energy_scheduler(scheduler_factory, url, ignorable=False)
    control_plane.create_pod("p", e2e_namespace, scheduler_name=name, cpu="1",
                             node_selector=sel)
    started = []
    node = assert_waits_then_schedules(
        control_plane, e2e_namespace, "p",
        lambda: started.append(extender_factory(profiles, binds(control_plane), port=port)),
        expect_in_event="connection refused")
    assert node == names[0]  # the extender, back, decided: the efficient node
    assert started[0].requests("filter", "200") >= 1


# --------------------------------------------------------------------------
# extender slower than httpTimeout
# --------------------------------------------------------------------------

def test_slow_extender_ignorable_is_skipped(
        control_plane, scheduler_factory, extender_factory, fault_proxy, two_nodes,
        e2e_namespace):
    sel, names, profiles = two_nodes
    ext = extender_factory(profiles, binds(control_plane))
    delay = http_timeout_seconds() + 1.5
    proxy = fault_proxy(ext.url, {"*": ("delay", delay)})
    name, sched = start_energy_scheduler(scheduler_factory, proxy.url, ignorable=True)
    t0 = time.monotonic()
    control_plane.create_pod("p", e2e_namespace, scheduler_name=name, cpu="1",
                             node_selector=sel)
    assert control_plane.wait_for_pod_scheduled("p", e2e_namespace, timeout=30) in names
    took = time.monotonic() - t0
    log = sched.log_text()
    assert SKIPPED in log and "Client.Timeout exceeded" in log, sched.log_tail()
    assert proxy.count("filter") >= 1
    # filter timed out after httpTimeout, then prioritize did too: never the full delay
    assert took < 2 * delay + 5, took


def test_slow_extender_not_ignorable_waits_then_schedules(
        control_plane, scheduler_factory, extender_factory, fault_proxy, two_nodes,
        e2e_namespace):
    sel, names, profiles = two_nodes
    ext = extender_factory(profiles, binds(control_plane))
    proxy = fault_proxy(ext.url, {"*": ("delay", http_timeout_seconds() + 1.5)})
    name, _ = start_energy_scheduler(scheduler_factory, proxy.url, ignorable=False)
    control_plane.create_pod("p", e2e_namespace, scheduler_name=name, cpu="1",
                             node_selector=sel)
    node = assert_waits_then_schedules(
        control_plane, e2e_namespace, "p", lambda: proxy.set("*", PASS),
        expect_in_event="Client.Timeout exceeded", proxy=proxy)
    assert node == names[0]
    assert ext.requests("filter", "200") >= 1


# --------------------------------------------------------------------------
# extender answering HTTP 500 or garbage
# --------------------------------------------------------------------------

FAULTS = {
    "http-500": (("status", 500), "code 500"),
    "garbage": ("garbage", "invalid character '<'"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_broken_extender_ignorable_is_skipped(
        control_plane, scheduler_factory, fault_proxy, two_nodes, e2e_namespace, fault):
    sel, names, _ = two_nodes
    mode, expected = FAULTS[fault]
    proxy = fault_proxy(None, {"*": mode})
    name, sched = start_energy_scheduler(scheduler_factory, proxy.url, ignorable=True)
    control_plane.create_pod("p", e2e_namespace, scheduler_name=name, cpu="1",
                             node_selector=sel)
    assert control_plane.wait_for_pod_scheduled("p", e2e_namespace, timeout=30) in names
    log = sched.log_text()
    assert SKIPPED in log and expected in log, sched.log_tail()
    assert proxy.count("filter") >= 1
    assert not control_plane.pod_events("p", e2e_namespace, "FailedScheduling")


@pytest.mark.parametrize("fault", list(FAULTS))
def test_broken_extender_not_ignorable_blocks_and_retries(
        control_plane, scheduler_factory, extender_factory, fault_proxy, two_nodes,
        e2e_namespace, fault):
    sel, names, profiles = two_nodes
    mode, expected = FAULTS[fault]
    ext = extender_factory(profiles, binds(control_plane))
    proxy = fault_proxy(ext.url, {"*": mode})
    name, _ = start_energy_scheduler(scheduler_factory, proxy.url, ignorable=False)
    control_plane.create_pod("p", e2e_namespace, scheduler_name=name, cpu="1",
                             node_selector=sel)
    node = assert_waits_then_schedules(
        control_plane, e2e_namespace, "p", lambda: proxy.set("*", PASS),
        expect_in_event=expected, proxy=proxy)
    assert node == names[0]


def test_prioritize_errors_are_ignored_even_when_not_ignorable(
        control_plane, scheduler_factory, extender_factory, fault_proxy, two_nodes,
        e2e_namespace):
    """docs/extender.md: kube-scheduler only logs prioritize failures (at -v=5); the pod is
    scheduled on in-tree scores alone, so only our metrics can show it."""
    sel, names, profiles = two_nodes
    ext = extender_factory(profiles, binds(control_plane))
    proxy = fault_proxy(ext.url, {"prioritize": ("status", 500)})
    name, sched = start_energy_scheduler(scheduler_factory, proxy.url, ignorable=False,
                                         verbosity=5)
    control_plane.create_pod("p", e2e_namespace, scheduler_name=name, cpu="1",
                             node_selector=sel)
    assert control_plane.wait_for_pod_scheduled("p", e2e_namespace, timeout=30) in names
    assert proxy.count("prioritize") >= 1 and ext.requests("filter", "200") >= 1
    assert "No score given by this extender" in sched.log_text()
    assert not control_plane.pod_events("p", e2e_namespace, "FailedScheduling")


# --------------------------------------------------------------------------
# our extender refusing a request: counted in our metrics
# --------------------------------------------------------------------------

BAD_POD = {RUNTIME_ANNOTATION: "soon"}  # not a number of seconds: HTTP 400 from us


def test_bad_request_ignorable_is_skipped_and_counted(
        control_plane, scheduler_factory, extender_factory, two_nodes, e2e_namespace):
    sel, names, profiles = two_nodes
    ext = extender_factory(profiles, binds(control_plane))
    name, sched = start_energy_scheduler(scheduler_factory, ext.url, ignorable=True)
    assert ext.failures() == 0
    control_plane.create_pod("bad", e2e_namespace, scheduler_name=name, cpu="1",
                             node_selector=sel, annotations=BAD_POD)
    assert control_plane.wait_for_pod_scheduled("bad", e2e_namespace, timeout=30) in names
    assert ext.failures("filter", "bad_request") >= 1, ext.samples()
    assert ext.requests("filter", "400") >= 1
    assert SKIPPED in sched.log_text() and "code 400" in sched.log_text()
    # prioritize failed too (ignored by kube-scheduler, counted by us)
    assert ext.failures("prioritize", "bad_request") >= 1
    assert f"Pod annotation {RUNTIME_ANNOTATION}" in ext.log_text()


def test_bad_request_not_ignorable_blocks_and_is_counted(
        control_plane, scheduler_factory, extender_factory, two_nodes, e2e_namespace):
    sel, _, profiles = two_nodes
    ext = extender_factory(profiles, binds(control_plane))
    name, _ = start_energy_scheduler(scheduler_factory, ext.url, ignorable=False)
    control_plane.create_pod("bad", e2e_namespace, scheduler_name=name, cpu="1",
                             node_selector=sel, annotations=BAD_POD)
    event = control_plane.wait_for_failed_scheduling("bad", e2e_namespace, timeout=30)
    assert "failed filter with extender" in event.message and "code 400" in event.message, \
        event.message
    deadline = time.monotonic() + 20  # retried with back-off: 1 s, 2 s, ...
    while ext.failures("filter", "bad_request") < 2 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert ext.failures("filter", "bad_request") >= 2, ext.samples()
    assert not control_plane.pod_node("bad", e2e_namespace)
    assert ext.requests("prioritize") == 0  # the cycle ended at filter
