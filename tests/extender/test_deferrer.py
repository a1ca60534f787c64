"""joulesched deferrer's logic (extender/deferrer.py, extender/admission.py): fake clock, no network.

The fake API applies the JSON patch the way the apiserver does (RFC 6902: a failed ``test`` op
rejects the whole patch), so the tests show what reaches a pod, not what the code meant to send.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from joulesched.extender.admission import ReviewError, gate_patch, review
from joulesched.extender.deferrer import (
    Deferrer,
    DeferrerMetrics,
    LeaderElector,
    forecast_for,
    is_gated,
    parse_args,
    pod_sites,
    release_patch,
)
from joulesched.policy.deferral import DEADLINE_ANNOTATION, GATE, MAX_DELAY_ANNOTATION, LowestOf
from joulesched.policy.demand import RUNTIME_ANNOTATION
from joulesched.policy.site import ConstantIntensity, IntensitySeries, SiteCatalogue, SiteModel

H = 3600.0
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
# north: 300 g/kWh for hours 0-5, 100 for hours 6-8, 400 after; south: flat 250
NORTH = IntensitySeries.regular(T0, H, [300] * 6 + [100] * 3 + [400] * 39, outside="error")
CATALOGUE = SiteCatalogue(
    sites={
        "north": SiteModel("north", pue=1.5, carbon=NORTH),
        "south": SiteModel("south", carbon=ConstantIntensity(250.0)),
    }
)
OTHER_GATE = {"name": "example.com/quota"}


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeApi:
    """Pods by (namespace, name); JSON patch with RFC 6902 test semantics; Events recorded."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.patches: list[tuple[str, str]] = []
        self.events: list[tuple[str, str, str, str]] = []
        self.rv = 100

    def add(self, pod: dict[str, Any]) -> None:
        self.rv += 1
        pod["metadata"]["resourceVersion"] = str(self.rv)
        self.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod

    def snapshot(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for p in self.pods.values()]

    def patch_pod(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> bool:
        pod = self.pods[(namespace, name)]
        spec = copy.deepcopy(pod["spec"])
        for op in ops:
            assert op["path"] == "/spec/schedulingGates", op  # the only field the deferrer may touch
            if op["op"] == "test":
                if spec.get("schedulingGates") != op["value"]:
                    return False
            elif op["op"] == "replace":
                spec["schedulingGates"] = op["value"]
            elif op["op"] == "remove":
                del spec["schedulingGates"]
            else:
                raise AssertionError(op)
        removed = {g["name"] for g in pod["spec"].get("schedulingGates", [])} - {
            g["name"] for g in spec.get("schedulingGates", [])
        }
        assert removed == {GATE}, removed  # exactly our gate, never another controller's
        pod["spec"] = spec
        self.rv += 1
        pod["metadata"]["resourceVersion"] = str(self.rv)
        self.patches.append((namespace, name))
        return True

    def event(self, pod: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((pod["metadata"]["name"], type_, reason, message))


def make_pod(
    name: str,
    annotations: dict[str, str],
    *,
    created: float = T0,
    gates: list[dict[str, str]] | None = None,
    site: str | None = None,
    cpu: str = "2",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulingGates": [{"name": GATE}] if gates is None else gates,
        "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}],
    }
    if site:
        spec["nodeSelector"] = {"joulesched.io/site": site}
    created_text = datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "creationTimestamp": created_text,
            "annotations": annotations,
        },
        "spec": spec,
    }


def deferrer(api: FakeApi, clock: Clock, **kw: Any) -> Deferrer:
    kw.setdefault("interval", 60.0)
    return Deferrer(api, CATALOGUE, clock=clock, metrics=DeferrerMetrics(), **kw)


def value(d: Deferrer, name: str, labels: dict[str, str] | None = None) -> float:
    v = d.metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if v is None else v


def run_until(d: Deferrer, api: FakeApi, clock: Clock, end: float, every: float = 60.0) -> None:
    while clock.t < end:
        d.tick(api.snapshot())
        clock.t += every


def test_held_until_the_clean_hour_then_released_once_keeping_other_gates() -> None:
    api, clock = FakeApi(), Clock(T0)
    api.add(
        make_pod(
            "a",
            {MAX_DELAY_ANNOTATION: str(12 * H), RUNTIME_ANNOTATION: str(2 * H)},
            site="north",
            gates=[OTHER_GATE, {"name": GATE}],
        )
    )
    d = deferrer(api, clock)
    out = d.tick(api.snapshot())
    assert [(o.reason, o.released) for o in out] == [("hold", False)]
    assert out[0].decision is not None and out[0].decision.planned_start == T0 + 6 * H
    assert value(d, "joulesched_deferrer_pods_held") == 1
    # within 2 % of the plan's mean: starting at 5:59 puts 1 of 120 minutes in the dirty hour
    run_until(d, api, clock, T0 + 6 * H - 120)
    assert api.patches == []  # never released before the clean hour
    run_until(d, api, clock, T0 + 7 * H)
    assert api.patches == [("ns", "a")]  # released once, at 6 h, then never patched again
    assert api.pods[("ns", "a")]["spec"]["schedulingGates"] == [OTHER_GATE]
    assert value(d, "joulesched_deferrer_released_total", {"reason": "clean"}) == 1
    assert value(d, "joulesched_deferrer_pods_held") == 0
    assert [(e[1], e[2]) for e in api.events] == [("Normal", "Released")]
    # released at 5:59: (300 - its run's mean) g/kWh x 2 cores x 3.3 W x PUE 1.5 x 2 h
    at_release = (300 * 60 + 100 * (2 * H - 60)) / (2 * H)
    kwh = 2 * 3.3 * 1.5 * 2 * H / 3.6e6
    assert value(d, "joulesched_deferrer_avoided_grams_total") == pytest.approx((300 - at_release) * kwh)
    assert value(d, "joulesched_deferrer_deadlines_missed_total") == 0


def test_gate_removed_entirely_when_it_is_the_only_one() -> None:
    assert release_patch([{"name": GATE}]) == [
        {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": GATE}]},
        {"op": "remove", "path": "/spec/schedulingGates"},
    ]


@pytest.mark.parametrize(
    ("annotations", "named"),
    [
        ({MAX_DELAY_ANNOTATION: "soon"}, MAX_DELAY_ANNOTATION),
        ({DEADLINE_ANNOTATION: "2026-01-01T10:00:00"}, DEADLINE_ANNOTATION),
        ({MAX_DELAY_ANNOTATION: "3600", RUNTIME_ANNOTATION: "-1"}, RUNTIME_ANNOTATION),
        ({}, "no joulesched.io/deadline"),
    ],
)
def test_bad_terms_release_at_once_with_a_warning_naming_why(annotations: dict[str, str], named: str) -> None:
    api, clock = FakeApi(), Clock(T0)
    api.add(make_pod("bad", annotations))
    d = deferrer(api, clock)
    (out,) = d.tick(api.snapshot())
    assert out.released and out.reason == "invalid"
    assert not is_gated(api.pods[("ns", "bad")])
    (event,) = api.events
    assert event[1:3] == ("Warning", "InvalidDeferral") and named in event[3]
    assert value(d, "joulesched_deferrer_released_total", {"reason": "invalid"}) == 1


def test_latest_start_is_never_passed_and_misses_stay_zero() -> None:
    # deadline 5 h, runtime 2 h: the clean hours (6-9) are out of reach; latest start is 3 h
    api, clock = FakeApi(), Clock(T0)
    api.add(
        make_pod("late", {DEADLINE_ANNOTATION: "2026-01-01T05:00:00Z", RUNTIME_ANNOTATION: str(2 * H)}, site="north")
    )
    d = deferrer(api, clock)
    run_until(d, api, clock, T0 + 4 * H)
    assert api.patches == [("ns", "late")]
    # hours 0-5 are equally dirty: nothing in the window beats now, released at once as clean
    assert value(d, "joulesched_deferrer_released_total", {"reason": "clean"}) == 1
    assert value(d, "joulesched_deferrer_deadlines_missed_total") == 0


def test_deadline_release_at_the_latest_start() -> None:
    # deadline 8 h, runtime 3 h: latest start 5 h; the best run in the window starts at 5 h itself
    # (hours 5..8 = 300, 100, 100) and the deferrer releases then, not later.
    api, clock = FakeApi(), Clock(T0)
    api.add(make_pod("d", {DEADLINE_ANNOTATION: "2026-01-01T08:00:00Z", RUNTIME_ANNOTATION: str(3 * H)}, site="north"))
    d = deferrer(api, clock, step=900.0)
    released_at = None
    while clock.t < T0 + 6 * H and released_at is None:
        if any(o.released for o in d.tick(api.snapshot())):
            released_at = clock.t
        clock.t += 60.0
    assert released_at is not None and released_at <= T0 + 5 * H
    assert value(d, "joulesched_deferrer_deadlines_missed_total") == 0


def test_a_pod_seen_after_its_latest_start_counts_as_a_miss() -> None:
    # the deferrer was down: the pod's latest start (3 h) passed two hours before it looked
    api, clock = FakeApi(), Clock(T0 + 5 * H)
    api.add(make_pod("m", {DEADLINE_ANNOTATION: "2026-01-01T06:00:00Z", RUNTIME_ANNOTATION: str(3 * H)}, site="north"))
    d = deferrer(api, clock)
    (out,) = d.tick(api.snapshot())
    assert out.released and out.reason == "deadline"
    assert value(d, "joulesched_deferrer_deadlines_missed_total") == 1


def test_expired_pod_released_at_once_not_counted_as_missed() -> None:
    api, clock = FakeApi(), Clock(T0)
    api.add(make_pod("x", {DEADLINE_ANNOTATION: "2026-01-01T01:00:00Z", RUNTIME_ANNOTATION: str(2 * H)}))
    d = deferrer(api, clock)
    (out,) = d.tick(api.snapshot())
    assert out.reason == "expired" and out.released
    assert value(d, "joulesched_deferrer_deadlines_missed_total") == 0


def test_two_controllers_on_one_stale_view_release_once() -> None:
    api, clock = FakeApi(), Clock(T0 + 6 * H)
    api.add(make_pod("a", {MAX_DELAY_ANNOTATION: str(12 * H)}, site="north", gates=[{"name": GATE}, OTHER_GATE]))
    view = api.snapshot()  # both read the pod before either writes
    one, two = deferrer(api, clock), deferrer(api, clock)
    assert [o.released for o in one.tick(view)] == [True]
    assert [o.released for o in two.tick(view)] == [False]
    assert api.patches == [("ns", "a")]
    assert api.pods[("ns", "a")]["spec"]["schedulingGates"] == [OTHER_GATE]
    assert value(two, "joulesched_deferrer_errors_total", {"reason": "conflict"}) == 1
    # another controller changed the gates meanwhile: the patch is refused, nothing clobbered
    api.add(make_pod("b", {MAX_DELAY_ANNOTATION: str(12 * H)}, site="north", gates=[{"name": GATE}, OTHER_GATE]))
    stale = api.snapshot()
    api.pods[("ns", "b")]["spec"]["schedulingGates"] = [{"name": GATE}]
    assert [o.released for o in two.tick([p for p in stale if p["metadata"]["name"] == "b"])] == [False]
    assert api.pods[("ns", "b")]["spec"]["schedulingGates"] == [{"name": GATE}]


def test_own_release_not_repatched_while_the_cache_lags() -> None:
    api, clock = FakeApi(), Clock(T0 + 6 * H)
    api.add(make_pod("a", {MAX_DELAY_ANNOTATION: str(12 * H)}))
    view = api.snapshot()
    d = deferrer(api, clock)
    d.tick(view)
    assert d.tick(view) == []  # the same resourceVersion: ours, skipped without a patch
    assert value(d, "joulesched_deferrer_errors_total", {"reason": "conflict"}) == 0


def test_site_from_selector_or_lowest_of_all() -> None:
    api, clock = FakeApi(), Clock(T0)
    api.add(make_pod("south", {MAX_DELAY_ANNOTATION: str(12 * H)}, site="south"))  # flat: nothing to wait for
    api.add(make_pod("any", {MAX_DELAY_ANNOTATION: str(12 * H)}))  # lowest of 300/250 now, 100 at 6 h
    api.add(make_pod("nowhere", {MAX_DELAY_ANNOTATION: str(12 * H)}, site="mars"))
    d = deferrer(api, clock)
    out = {o.name: o for o in d.tick(api.snapshot())}
    assert out["south"].reason == "clean" and out["south"].released
    assert out["any"].reason == "hold" and out["any"].decision is not None
    assert out["any"].decision.now_mean == 250 and out["any"].decision.planned_mean == 100
    assert out["nowhere"].reason == "no_forecast" and out["nowhere"].released


def test_pod_sites_reads_selector_and_required_affinity() -> None:
    label = "joulesched.io/site"

    def pod(spec: dict[str, Any]) -> dict[str, Any]:
        return {"spec": spec}

    def terms(*t: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": e} for e in t]
                    }
                }
            }
        }

    assert pod_sites(pod({})) is None
    assert pod_sites(pod({"nodeSelector": {label: "north"}})) == ("north",)
    assert pod_sites(pod(terms([{"key": label, "operator": "In", "values": ["north", "south"]}]))) == ("north", "south")
    # ORed terms: one without a site restriction allows any site
    assert (
        pod_sites(
            pod(
                terms(
                    [{"key": label, "operator": "In", "values": ["north"]}],
                    [{"key": "zone", "operator": "In", "values": ["a"]}],
                )
            )
        )
        is None
    )
    both = {"nodeSelector": {label: "north"}, **terms([{"key": label, "operator": "In", "values": ["north", "south"]}])}
    assert pod_sites(pod(both)) == ("north",)
    source, _ = forecast_for(CATALOGUE, ("north", "south"))
    assert isinstance(source, LowestOf)


def test_malformed_resources_skip_the_estimate_not_the_release() -> None:
    api, clock = FakeApi(), Clock(T0 + 6 * H)
    api.add(make_pod("r", {MAX_DELAY_ANNOTATION: str(12 * H), RUNTIME_ANNOTATION: "3600"}, site="north", cpu="lots"))
    d = deferrer(api, clock)
    (out,) = d.tick(api.snapshot())
    assert out.released
    assert value(d, "joulesched_deferrer_avoided_grams_total") == 0


# -- leader election ------------------------------------------------------------------------------


class FakeLeaseStore:
    def __init__(self) -> None:
        self.spec: dict[str, Any] | None = None
        self.rv = 0

    def read(self) -> dict[str, Any] | None:
        return None if self.spec is None else {"spec": copy.deepcopy(self.spec), "rv": str(self.rv)}

    def create(self, spec: dict[str, Any]) -> bool:
        if self.spec is not None:
            return False
        self.spec, self.rv = copy.deepcopy(spec), self.rv + 1
        return True

    def replace(self, spec: dict[str, Any], rv: str) -> bool:
        if rv != str(self.rv):
            return False
        self.spec, self.rv = copy.deepcopy(spec), self.rv + 1
        return True


def test_one_leader_and_the_standby_takes_over_after_the_lease_duration() -> None:
    store, mono = FakeLeaseStore(), Clock(0.0)
    a = LeaderElector(store, "a", lease_duration=15, renew_deadline=10, monotonic=mono, wall=lambda: T0 + mono.t)
    b = LeaderElector(store, "b", lease_duration=15, renew_deadline=10, monotonic=mono, wall=lambda: T0 + mono.t)
    assert a.step() and not b.step()
    for _ in range(10):  # a renews every 2 s; b never leads
        mono.t += 2
        assert a.step() and not b.step()
    # a dies (stops renewing): b waits a whole lease duration from when it last saw a change
    died = mono.t
    while not b.step():
        mono.t += 1
        assert mono.t - died <= 16
    assert mono.t - died >= 15
    assert store.spec is not None and store.spec["holderIdentity"] == "b" and store.spec["leaseTransitions"] == 1
    # a, had it survived cut off from the API, stood down at its renew deadline, before b could lead
    assert not a.leading


def test_a_clean_stop_hands_the_lease_over_at_once() -> None:
    store, mono = FakeLeaseStore(), Clock(0.0)
    a = LeaderElector(store, "a", monotonic=mono)
    b = LeaderElector(store, "b", monotonic=mono)
    assert a.step() and not b.step()
    a.release()
    mono.t += 2
    assert b.step()


def test_options_are_checked() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--site-file", "s.yaml", "--interval", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--site-file", "s.yaml", "--renew-deadline", "20"])
    with pytest.raises(SystemExit):
        parse_args(["--site-file", "s.yaml", "--webhook-listen", ":8443"])
    assert parse_args(["--site-file", "s.yaml", "--clock-offset", "3600"]).clock_offset == 3600


# -- the admission webhook ------------------------------------------------------------------------------


def admission_review(pod: dict[str, Any], operation: str = "CREATE") -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": operation,
                "namespace": "ns",
                "object": pod,
            },
        }
    ).encode()


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    assert answer["response"]["patchType"] == "JSONPatch"
    return list(json.loads(base64.b64decode(answer["response"]["patch"])))


def test_webhook_adds_the_gate_to_an_opting_in_pod() -> None:
    pod = make_pod("p", {MAX_DELAY_ANNOTATION: "3600"}, gates=[])
    del pod["spec"]["schedulingGates"]
    answer = review(admission_review(pod))
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002" and answer["response"]["allowed"]
    assert patch_of(answer) == [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]
    # beside another gate: appended (a deadline is at most a month ahead: admission reads it now)
    soon = datetime.fromtimestamp(time.time() + 86400, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with_other = make_pod("p", {DEADLINE_ANNOTATION: soon}, gates=[OTHER_GATE])
    assert patch_of(review(admission_review(with_other))) == [
        {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}}
    ]


def test_webhook_leaves_other_pods_alone() -> None:
    for pod in (
        make_pod("plain", {}, gates=[]),  # no deferral annotation
        make_pod("done", {MAX_DELAY_ANNOTATION: "60"}),
    ):  # already gated
        answer = review(admission_review(pod))
        assert answer["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}
    bad = make_pod("bad", {MAX_DELAY_ANNOTATION: "a while"}, gates=[])
    answer = review(admission_review(bad))
    assert "patch" not in answer["response"] and answer["response"]["allowed"]
    assert MAX_DELAY_ANNOTATION in answer["response"]["warnings"][0]
    bound = make_pod("bound", {MAX_DELAY_ANNOTATION: "60"}, gates=[])
    bound["spec"]["nodeName"] = "n1"
    assert gate_patch(bound)[0] == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{", "not JSON"),
        (b"[]", "JSON object"),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}).encode(),
            "admissionReviewVersions",
        ),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}).encode(),
            "request.uid",
        ),
    ],
)
def test_webhook_rejects_what_is_not_an_admission_review(body: bytes, says: str) -> None:
    with pytest.raises(ReviewError, match=says):
        review(body)


def test_nan_free_messages() -> None:
    # a no_forecast release has no intensity to quote: the message says so plainly, without "nan"
    api, clock = FakeApi(), Clock(T0)
    api.add(make_pod("n", {MAX_DELAY_ANNOTATION: "600"}, site="mars"))
    d = deferrer(api, clock)
    (out,) = d.tick(api.snapshot())
    assert "nan" not in out.message.lower() and math.isfinite(clock.t)


# -- health and the command's checks -------------------------------------------------------------


class Unavailable:
    name = "broken feed"

    def at(self, t: float) -> float:
        from joulesched.policy.site import IntensityUnavailable

        raise IntensityUnavailable("never read")

    def integral(self, a: float, b: float) -> float:
        return self.at(a)


def test_readiness_names_the_role_and_what_each_site_says() -> None:
    from joulesched.extender.deferrer import Health

    h = Health(CATALOGUE, Clock(T0 + 6.5 * H))
    assert h.ready()[0] is False  # starting: neither leader nor standby yet
    h.role = "standby"
    ok, doc = h.ready()
    assert ok and doc["sites"] == {"north": "100 gCO2e/kWh", "south": "250 gCO2e/kWh"}
    h.role, h.cache_synced = "leader", lambda: False
    assert h.ready()[0] is False  # leads but has not listed the pods yet
    dead = Health(SiteCatalogue(sites={"x": SiteModel("x", carbon=Unavailable())}), Clock(T0), role="standby")
    ok, doc = dead.ready()
    assert not ok and not doc["site_data_readable"] and doc["sites"]["x"].startswith("unavailable: never read")


def test_missing_files_are_errors_naming_them(tmp_path: Any, capsys: Any) -> None:
    from joulesched.extender.deferrer import main

    assert main(["--site-file", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: no such file" in capsys.readouterr().err
    sites = tmp_path / "sites.yaml"
    sites.write_text("sites:\n  a: {carbon_intensity: 100}\n")
    assert main(["--site-file", str(sites), "--kubeconfig", str(tmp_path / "kc")]) == 2
    assert "kc: no such file" in capsys.readouterr().err
    sites.write_text("sites:\n  a: {carbon_intensity: lots}\n")
    assert main(["--site-file", str(sites), "--kubeconfig", str(tmp_path / "kc")]) == 2
    assert "sites.a.carbon_intensity" in capsys.readouterr().err


def test_exposition_is_declared_in_names_and_passes_promtool() -> None:
    import shutil
    import subprocess

    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from joulesched.contracts import names

    api, clock = FakeApi(), Clock(T0 + 6 * H)
    api.add(make_pod("a", {MAX_DELAY_ANNOTATION: str(12 * H), RUNTIME_ANNOTATION: "3600"}, site="north"))
    d = deferrer(api, clock)
    d.tick(api.snapshot())
    text = generate_latest(d.metrics.registry)
    declared = {m.name: m for m in names.METRICS}
    seen = set()
    for family in text_string_to_metric_families(text.decode()):
        if family.name.endswith("_created"):  # prometheus-client's companion of each counter
            continue
        full = family.name + ("_total" if family.type == "counter" else "")
        assert full in declared and declared[full].type == family.type, full
        for sample in family.samples:
            assert set(sample.labels) == set(declared[full].labels), (full, sample.labels)
        seen.add(full)
    assert seen == {m.name for m in names.METRICS if m.name.startswith("joulesched_deferrer_")}
    if shutil.which("promtool"):
        r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60)
        assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), (r.stdout + r.stderr).decode()


def test_waiting_into_a_dirtier_hour_counts_as_added_not_avoided() -> None:
    # created in the clean hours (100) but first seen at 9 h (the deferrer was down): every start
    # left is at 400, so it goes now, 300 g/kWh dirtier than had it started at creation
    api, clock = FakeApi(), Clock(T0 + 9 * H)
    api.add(
        make_pod(
            "a",
            {MAX_DELAY_ANNOTATION: str(5 * H), RUNTIME_ANNOTATION: "3600"},
            created=T0 + 7 * H,
            site="north",
            cpu="4",
        )
    )
    d = deferrer(api, clock)
    (out,) = d.tick(api.snapshot())
    assert out.released and out.reason == "clean"
    kwh = 4 * 3.3 * 1.5 * H / 3.6e6
    assert value(d, "joulesched_deferrer_added_grams_total") == pytest.approx(300 * kwh)
    assert value(d, "joulesched_deferrer_avoided_grams_total") == 0


def test_a_deadline_release_is_accounted_from_the_forecast() -> None:
    # latest start 5 h (deadline 8 h, runtime 3 h): released then as "deadline", which carries no
    # means of its own; the estimate takes the run's from the forecast: (300 - 500/3) g/kWh
    api, clock = FakeApi(), Clock(T0)
    api.add(
        make_pod(
            "d", {DEADLINE_ANNOTATION: "2026-01-01T08:00:00Z", RUNTIME_ANNOTATION: str(3 * H)}, site="north", cpu="1"
        )
    )
    # no early release a minute before; ticks exactly on the minute, so none is late
    d = deferrer(api, clock, step=H, tolerance=0.0, next_tick_within=0.0)
    run_until(d, api, clock, T0 + 5 * H + 120)
    assert value(d, "joulesched_deferrer_released_total", {"reason": "deadline"}) == 1
    kwh = 1 * 3.3 * 1.5 * 3 * H / 3.6e6
    assert value(d, "joulesched_deferrer_avoided_grams_total") == pytest.approx((300 - 500 / 3) * kwh)
    assert value(d, "joulesched_deferrer_deadlines_missed_total") == 0


def test_a_pod_deleted_while_held_leaves_the_count() -> None:
    api, clock = FakeApi(), Clock(T0)
    api.add(make_pod("a", {MAX_DELAY_ANNOTATION: str(12 * H)}, site="north"))
    d = deferrer(api, clock)
    d.tick(api.snapshot())
    assert value(d, "joulesched_deferrer_pods_held") == 1
    api.pods.clear()
    assert d.tick(api.snapshot()) == []
    assert value(d, "joulesched_deferrer_pods_held") == 0 and not d._seen


def test_a_sites_fallback_is_not_a_forecast() -> None:
    # Past the series' end a fallback of 50 g/kWh answers scoring; the deferrer must not read it
    # as a clean hour ahead and hold the pod for it.
    from joulesched.policy.deferral import Deferral, decide
    from joulesched.policy.site import WithFallback

    short = IntensitySeries.regular(T0, H, [300.0] * 4, outside="error")
    catalogue = SiteCatalogue(sites={"north": SiteModel("north", carbon=WithFallback(short, ConstantIntensity(50.0)))})
    source, _ = forecast_for(catalogue, ("north",))
    assert source is short
    decision = decide(Deferral(T0, T0 + 12 * H, H), T0, source)
    assert decision.release and decision.reason == "clean"


def test_the_baseline_at_submission_is_the_decisions_mean_over_the_run_however_short() -> None:
    # The saved-carbon baseline and the release's intensity come from one formula: a pod
    # released at submission books nothing avoided, however short its run. Before, the
    # baseline stretched a run under 1 s to 1 s and booked 200 g/kWh for a 0.5 s pod.
    from joulesched.extender.deferrer import _run_mean
    from joulesched.policy.deferral import Deferral, decide
    from joulesched.policy.site import IntensitySeries

    forecast = IntensitySeries.regular(0.0, 3600.0, [100.0, 500.0])
    t = 3599.5
    for runtime in (0.5, 3600.0):
        decision = decide(Deferral(submitted=t, deadline=t + 7200, runtime=runtime), t, forecast)
        assert decision.reason == "clean"
        assert _run_mean(forecast, t, runtime) == decision.now_mean


def test_a_deferrer_ticking_as_its_loop_does_releases_before_the_latest_start() -> None:
    """The loop ticks an interval after the last tick ended, polled every --retry-period: 31 s
    apart here. A pod whose latest start falls before the next tick is released at this one."""
    api, clock = FakeApi(), Clock(T0)
    d = Deferrer(api, CATALOGUE, clock=clock, metrics=DeferrerMetrics(), interval=30.0)
    api.add(make_pod("job", {MAX_DELAY_ANNOTATION: str(6 * H)}, site="north"))  # no runtime: latest start 6 h
    clock.t = T0 + 6 * H - 0.5 - 31.0 * 3
    for _ in range(4):
        d.tick(api.snapshot())
        clock.t += 31.0
    assert not api.pods[("ns", "job")]["spec"].get("schedulingGates")
    assert value(d, "joulesched_deferrer_released_total", {"reason": "deadline"}) == 1
    assert value(d, "joulesched_deferrer_deadlines_missed_total") == 0


def test_a_refreshed_carbon_series_file_is_read_again(tmp_path: Any) -> None:
    """docs/deferral.md: a carbon_series CSV that the deferrer re-reads when it changes (a cron job
    refreshing it is the way to a live forecast)."""
    import os

    from joulesched.contracts.sitefile import load_site_file

    def write(start: float, values: list[float]) -> None:
        rows = [f"{datetime.fromtimestamp(start + H * i, UTC).isoformat()},{v}" for i, v in enumerate(values)]
        (tmp_path / "north.csv").write_text("\n".join(["timestamp,avg_CI", *rows]) + "\n")

    write(T0, [300.0] * 24)  # yesterday's file: day 1 only
    (tmp_path / "sites.yaml").write_text("sites:\n  north:\n    carbon_series: {file: north.csv, outside: error}\n")
    catalogue = load_site_file(tmp_path / "sites.yaml")
    write(T0 + 24 * H, [500.0] * 6 + [50.0] * 18)  # refreshed: day 2, dirty now, clean from hour 30
    os.utime(tmp_path / "north.csv", (T0 + 25 * H, T0 + 25 * H))
    api, clock = FakeApi(), Clock(T0 + 24 * H + 60)
    d = Deferrer(api, catalogue, clock=clock, metrics=DeferrerMetrics(), interval=60.0)
    api.add(make_pod("job", {MAX_DELAY_ANNOTATION: "43200", RUNTIME_ANNOTATION: "3600"}, created=T0 + 24 * H, site="north"))
    [out] = d.tick(api.snapshot())
    assert (out.released, out.reason) == (False, "hold"), out.message


def test_the_webhook_of_a_deferrer_of_one_namespace_gates_only_that_namespaces_pods() -> None:
    pod = make_pod("p", {MAX_DELAY_ANNOTATION: "3600"}, gates=[])
    del pod["spec"]["schedulingGates"]
    other = json.loads(admission_review(pod))
    other["request"]["namespace"] = "team-b"
    answer = review(json.dumps(other).encode(), namespace="ns")
    assert "patch" not in answer["response"]
    assert answer["response"]["warnings"] == [f"{GATE}: not added, the deferrer releases pods of namespace ns only"]
    assert patch_of(review(admission_review(pod), namespace="ns")), "its own namespace's pods are gated"


def test_the_webhook_serves_a_renewed_certificate_without_a_restart(tmp_path: Any) -> None:
    """cert-manager renews the Secret's files in place: the next handshake gets the new one."""
    import shutil
    import socket
    import ssl
    import subprocess

    from joulesched.extender.admission import WebhookServer

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI")

    def make(name: str) -> tuple[Any, Any]:
        crt, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-days", "2", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True)
        return crt, key

    def served(port: int) -> bytes:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
            cert = tls.getpeercert(binary_form=True)
            assert cert is not None
            return cert

    def der(crt: Any) -> bytes:
        return ssl.PEM_cert_to_DER_cert(crt.read_text())

    old, new = make("old"), make("new")
    live_crt, live_key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(old[0], live_crt)
    shutil.copy(old[1], live_key)
    webhook = WebhookServer("127.0.0.1", 0, str(live_crt), str(live_key))
    webhook.start()
    try:
        assert served(webhook.port) == der(old[0])
        assert webhook.reload_if_changed() is False, "unchanged files are not loaded again"
        shutil.copy(new[0], live_crt)
        shutil.copy(new[1], live_key)
        assert webhook.reload_if_changed() is True
        assert served(webhook.port) == der(new[0])
        live_key.write_text("not a key\n")  # written half-way: the one in use stays
        assert webhook.reload_if_changed() is False and served(webhook.port) == der(new[0])
    finally:
        webhook.stop()


def test_a_site_file_edited_in_place_is_read_again_and_a_broken_edit_keeps_the_sites(tmp_path: Any) -> None:
    """deploy/deferrer's ConfigMap keeps its name (no hash): an edit reaches the running deferrer."""
    import os

    from joulesched.extender.deferrer import _file_stamp, read_sites_again

    path = tmp_path / "sites.yaml"
    path.write_text("sites:\n  north: {carbon_intensity: 400}\n")
    stamp = _file_stamp(str(path))
    assert read_sites_again(str(path), stamp) == (stamp, None), "unchanged: not read"
    path.write_text("sites:\n  north: {carbon_intensity: 120}\n  south: {carbon_intensity: 50}\n")
    os.utime(path, ns=(stamp[0] + 10**9, stamp[0] + 10**9))  # type: ignore[index]
    stamp, sites = read_sites_again(str(path), stamp)
    assert sites is not None and sites.sites["north"].carbon.at(0) == 120 and set(sites.sites) == {"north", "south"}
    path.write_text("sites: [not, a, mapping]\n")
    os.utime(path, ns=(stamp[0] + 10**9, stamp[0] + 10**9))  # type: ignore[index]
    stamp2, broken = read_sites_again(str(path), stamp)
    assert broken is None and stamp2 != stamp, "refused once, and not read again until it changes"
    assert read_sites_again(str(path), stamp2) == (stamp2, None)
