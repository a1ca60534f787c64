"""Hostile input: one request must not poison later ones, crash a worker or forge logs."""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
import pytest
from flask.testing import FlaskClient

from joulesched.contracts import names as m
from joulesched.extender.profiles import profiles_from_samples
from tests.extender.support import make_node, make_pod, post

NODES = ["efficient", "hungry", "capped"]


def scores(client: FlaskClient, pod: dict[str, Any]) -> list[int]:
    status, reply = post(client, "prioritize", {"Pod": pod, "NodeNames": NODES})
    assert status == 200, reply
    return [h["Score"] for h in reply]


def test_an_infinite_cpu_request_is_400_and_does_not_poison_other_pods(client: FlaskClient) -> None:
    before = scores(client, make_pod("4", uid="other"))
    for _ in range(2):  # and a retry of the same UID
        status, reply = post(client, "prioritize", {"Pod": make_pod("1e309", uid="poison"), "NodeNames": NODES})
        assert status == 400, reply
        assert "requests[cpu]" in reply["Error"] and "finite" in reply["Error"]
    # the same number as a JSON literal: orjson refuses it (a 400, never infinity)
    body = orjson.dumps({"Pod": make_pod("CPU", uid="poison"), "NodeNames": NODES}).replace(b'"CPU"', b"1e309")
    status, reply = post(client, "prioritize", body)
    assert status == 400, reply
    assert scores(client, make_pod("4", uid="other")) == before
    assert len(client.application.extensions["joulesched"]["extender"].predicted) == 1  # only "other"


def test_predicted_load_and_curves_never_take_non_finite_values() -> None:
    import numpy as np

    from joulesched.extender.predicted import PredictedLoad
    from joulesched.policy.power import curve_power

    ledger = PredictedLoad(300, 10)
    for cores, gpus in ((float("inf"), 0.0), (float("nan"), 0.0), (1.0, float("inf")), (-1.0, 0.0), (2e6, 0.0)):
        ledger.record("u", "n", cores, gpus, 0.0, confirmed=False)
    assert len(ledger) == 0
    curve = np.array([np.linspace(50, 250, 11)])
    power = curve_power(curve, np.array([np.nan]))
    assert np.isnan(power[0])
    assert curve_power(curve, np.array([np.inf]))[0] == np.inf


@pytest.mark.parametrize(
    ("resource", "value", "field"),
    [
        ("cpu", "1e1000000", "requests[cpu]"),
        ("cpu", "2e6", "requests[cpu]"),
        ("cpu", "nan", "requests[cpu]"),
        ("memory", "2Ei", "requests[memory]"),
        ("nvidia.com/gpu", "1e30", "requests[nvidia.com/gpu]"),
        ("nvidia.com/gpu", 1e30, "requests[nvidia.com/gpu]"),
        ("nvidia.com/gpu", "20000", "requests[nvidia.com/gpu]"),
    ],
)
def test_absurd_quantities_are_400_naming_the_field(client: FlaskClient, resource: str, value: object, field: str) -> None:
    pod = make_pod("1")
    pod["spec"]["containers"][0]["resources"]["requests"][resource] = value
    for verb in ("prioritize", "filter", "explain", "preempt"):
        body = {"Pod": pod, "NodeNames": NODES} if verb != "preempt" else {"Pod": pod, "NodeNameToMetaVictims": {"efficient": {"Pods": []}}}
        status, reply = post(client, verb, body)
        assert status == 400, (verb, reply)
        assert field in reply["Error"]


def test_infinite_json_numbers_in_requests_are_400(client: FlaskClient) -> None:
    pod = make_pod("1")
    pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = None
    body = orjson.dumps({"Pod": pod, "NodeNames": NODES}).replace(b"null", b"-1e999")
    status, reply = post(client, "prioritize", body)
    assert status == 400 and "not valid JSON" in reply["Error"]


def test_a_long_quantity_is_rejected_in_linear_time(client: FlaskClient) -> None:
    def timed(digits: int) -> float:
        pod = make_pod("1" * digits + "x")
        started = time.perf_counter()
        status, reply = post(client, "prioritize", {"Pod": pod, "NodeNames": NODES})
        elapsed = time.perf_counter() - started
        assert status == 400 and "requests[cpu]" in reply["Error"]
        return elapsed

    timed(10)  # warm
    small = min(timed(10_000) for _ in range(3))
    large = min(timed(100_000) for _ in range(3))
    assert large < 0.5
    assert large / max(small, 1e-4) < 30


def test_parse_quantity_is_linear_on_digit_runs() -> None:
    from joulesched.policy.demand import QuantityError, parse_quantity

    started = time.perf_counter()
    for text in ("1" * 8000 + "x", "1" * 8000 + ".", "." + "1" * 8000 + "e", "1" * 100_000):
        with pytest.raises(QuantityError):
            parse_quantity(text, "q")
    assert time.perf_counter() - started < 0.5


def deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = {"a": value}
    return value


def test_deeply_nested_values_are_400_not_500(client: FlaskClient) -> None:
    node = make_node("efficient")
    node["metadata"]["labels"] = deep(250)
    # orjson refuses to write past 255 levels, so nest the text by hand
    nested = b'{"a":' * 300 + b'"x"' + b"}" * 300
    body = orjson.dumps({"Pod": make_pod(), "Nodes": {"items": [make_node("efficient")]}})
    body = body.replace(b'"kubernetes.io/hostname":"efficient"', b'"deep":' + nested)
    status, reply = post(client, "filter", body)  # the filter echoes the Node objects back
    assert status == 400 and "ExtenderArgs.Nodes.items[0]" in reply["Error"], reply
    status, reply = post(client, "prioritize", body)  # nothing echoed: an answer
    assert status == 200, reply
    pod_body = orjson.dumps({"Pod": make_pod(name="NAME"), "NodeNames": NODES}).replace(b'"NAME"', nested)
    for verb in ("prioritize", "filter", "explain", "preempt"):
        status, reply = post(client, verb, pod_body)
        assert status == 400, (verb, reply)
    pod = make_pod()
    pod["metadata"]["name"] = deep(200)
    status, reply = post(client, "prioritize", {"Pod": pod, "NodeNames": NODES})
    assert status == 400 and "metadata.name" in reply["Error"], reply


def test_every_500_is_json_and_counted(make_app) -> None:  # type: ignore[no-untyped-def]
    app, _ = make_app()
    ext = app.extensions["joulesched"]["extender"]
    ext.prioritize = lambda body: [{"Host": "a", "Score": 10**30}]  # unserialisable: over 64 bits
    endpoint_client = app.test_client()
    # the endpoint captured the bound methods at creation; replace its handler too
    app.wsgi_app.endpoint.handlers["prioritize"] = ext.prioritize  # type: ignore[attr-defined]
    status, reply = post(endpoint_client, "prioritize", {"Pod": make_pod(), "NodeNames": NODES})
    assert status == 500 and "internal error" in reply["Error"]
    text = endpoint_client.get("/metrics").data.decode()
    assert 'joulesched_extender_failures_total{reason="internal",verb="prioritize"} 1.0' in text
    assert 'joulesched_extender_requests_total{code="500",verb="prioritize"} 1.0' in text


def test_no_static_route(client: FlaskClient, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert client.get("/static/x").status_code == 404
    assert client.get("/static/joulesched/__init__.py").status_code == 404
    assert client.application.static_folder is None


def test_logged_request_text_cannot_forge_log_lines(client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="joulesched.extender")
    evil = 'x\nERROR forged line \x1b[31m'
    status, _ = post(client, "prioritize", {"Pod": make_pod("bogus" + evil), "NodeNames": NODES})
    assert status == 400
    status, _ = post(client, "prioritize", {"Pod": make_pod(), "NodeNames": [evil, 7]})
    assert status == 400
    messages = [r.getMessage() for r in caplog.records]
    assert messages
    assert all("\n" not in msg and "\x1b" not in msg for msg in messages), messages


def test_bad_request_log_lines_are_rate_limited(client: FlaskClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="joulesched.extender")
    for i in range(200):
        post(client, "prioritize", {"Pod": make_pod(f"bad{i}"), "NodeNames": NODES})
    lines = [r for r in caplog.records if "bad request" in r.getMessage()]
    assert 1 <= len(lines) <= 20
    text = client.get("/metrics").data.decode()
    assert 'joulesched_extender_failures_total{reason="bad_request",verb="prioritize"} 200.0' in text


def sample(name: str, value: str, **labels: str) -> dict[str, Any]:
    return {"metric": {"__name__": name, **labels}, "value": [1.0, value]}


def good_node(node: str, site: str = "north") -> list[dict[str, Any]]:
    return [
        sample(m.NODE_CPU_CORES.name, "64", node=node),
        sample(m.NODE_CPU_UTILISATION.name, "0.25", node=node),
        sample(m.MODEL_IDLE.name, "60", node=node, device="cpu"),
        sample(m.MODEL_PER_CORE.name, "3", node=node, device="cpu"),
        sample(m.NODE_PLATFORM_POWER.name, "108", node=node),
        sample(m.NODE_INFO.name, "1", node=node, site=site),
    ]


@pytest.mark.parametrize(
    ("name", "value", "labels"),
    [
        (m.NODE_CPU_CORES.name, "NaN", {}),
        (m.NODE_CPU_CORES.name, "+Inf", {}),
        (m.NODE_CPU_UTILISATION.name, "NaN", {}),
        (m.NODE_CPU_UTILISATION.name, "7", {}),
        (m.MODEL_IDLE.name, "NaN", {"device": "cpu"}),
        (m.MODEL_PER_CORE.name, "-Inf", {"device": "cpu"}),
        (m.NODE_PLATFORM_POWER.name, "NaN", {}),
        (m.NODE_PLATFORM_POWER.name, "-5", {}),
        (m.NODE_POWER_CAP.name, "NaN", {}),
        (m.NODE_SPEED.name, "Inf", {}),
        (m.NODE_GPU_COUNT.name, "NaN", {}),
        (m.NODE_GPU_COUNT.name, "1e300", {}),
        (m.NODE_GPU_MAX.name, "NaN", {}),
        (m.NODE_GPU_UTILISATION.name, "NaN", {}),
        (m.SITE_PUE.name, "NaN", {"site": "north"}),
        (m.SITE_PUE.name, "0.5", {"site": "north"}),
        (m.SITE_CARBON.name, "NaN", {"site": "north"}),
        (m.SITE_CARBON.name, "-1", {"site": "north"}),
        (m.NODE_CPU_CORES.name, "not a number", {}),
    ],
)
def test_a_bad_prometheus_sample_never_breaks_profiles(name: str, value: str, labels: dict[str, str]) -> None:
    import math

    from joulesched.policy.profile import NodeArrays

    values = good_node("bad") + good_node("good", site="south")
    site_level = "site" in labels
    values.append(sample(name, value, **labels) if site_level else sample(name, value, node="bad", **labels))
    measured = [{"metric": {"node": "bad"}, "value": [1.0, "NaN"]}, {"metric": {"node": "good"}, "value": [1.0, "1.0"]}]
    profiles, skipped = profiles_from_samples(values, measured)
    NodeArrays.build(profiles.nodes)
    names = [p.name for p in profiles.nodes]
    assert "good" in names
    for p in profiles.nodes:
        assert all(math.isfinite(w) and w >= 0 for w in p.power_curve_watts)
        assert math.isfinite(p.cores) and p.cores > 0
        assert 0 <= p.utilisation <= 1
        assert p.pue >= 1 and math.isfinite(p.pue)
        # unknown (NaN: no carbon sample for its site, which scores neutral under carbon) or a real intensity
        assert math.isnan(p.carbon_intensity) or (math.isfinite(p.carbon_intensity) and p.carbon_intensity >= 0)
        assert p.measured_watts is None or (math.isfinite(p.measured_watts) and p.measured_watts >= 0)
        assert p.power_cap_watts is None or (math.isfinite(p.power_cap_watts) and p.power_cap_watts > 0)
        assert p.updated is None or math.isfinite(p.updated)
        assert math.isfinite(p.speed) and p.speed > 0
        if p.gpus is not None:
            assert 0 < p.gpus.count <= 10_000
            assert math.isfinite(p.gpus.max_watts) and math.isfinite(p.gpus.idle_watts)
            assert 0 <= p.gpus.utilisation <= 1
    assert any("bad" in line for line in skipped) or "bad" in names


def test_a_node_with_a_nan_sample_scores_neutral_and_is_counted(make_app) -> None:  # type: ignore[no-untyped-def]
    from prometheus_client import CollectorRegistry

    from joulesched.extender.app import create_app
    from joulesched.extender.config import parse_config
    from joulesched.extender.metrics import ExtenderMetrics
    from joulesched.extender.profiles import Snapshot, _profiles_from_samples
    from joulesched.policy.profile import NodeArrays
    from tests.support import Clock

    values = good_node("bad") + good_node("good") + good_node("other")
    values[1] = sample(m.NODE_CPU_UTILISATION.name, "NaN", node="bad")
    profiles, _, invalid = _profiles_from_samples(values, [])
    assert invalid == {"bad"}
    clock = Clock()

    class Source:
        name = "prometheus"
        errors = 0

        def snapshot(self) -> Snapshot:
            return Snapshot(profiles, NodeArrays.build(profiles.nodes), clock(), 1, "", {}, invalid)

    metrics = ExtenderMetrics(CollectorRegistry())
    config = parse_config({"profiles": {"file": {"path": "/nonexistent"}}}, "test")
    app = create_app(config, source=Source(), metrics=metrics, clock=clock, background=False)
    c = app.test_client()
    status, reply = post(c, "prioritize", {"Pod": make_pod("2"), "NodeNames": ["bad", "good", "other"]})
    assert status == 200, reply
    neutral = config.policy.neutral_score
    assert reply[0]["Score"] == neutral
    text = c.get("/metrics").data.decode()
    assert 'joulesched_extender_neutral_scores_total{reason="invalid"} 1.0' in text


def test_a_bug_in_a_flask_route_is_a_counted_json_500(make_app) -> None:  # type: ignore[no-untyped-def]
    app, _ = make_app()
    ext = app.extensions["joulesched"]["extender"]

    def broken() -> None:
        raise RuntimeError("boom")

    ext.source.snapshot = broken
    c = app.test_client()
    reply = c.get("/readyz")
    assert reply.status_code == 500 and orjson.loads(reply.data)["Error"].startswith("internal error")
    text = c.get("/metrics").data.decode()
    assert 'joulesched_extender_failures_total{reason="internal",verb="other"} 1.0' in text


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

hostile_numbers = st.sampled_from(["1e309", "-1e309", "NaN", "Infinity", "18446744073709551616", "1e400", "9" * 300])
hostile_quantities = st.one_of(
    st.sampled_from(["1e309", "1e1000000", "inf", "nan", "1e30", "2e6", "1Ei", "-0", "1" * 70, ".5e-1000000"]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(alphabet="0123456789.eE+-kKMGTPEimun ", max_size=80),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    verb=st.sampled_from(["filter", "prioritize", "explain", "preempt"]),
    resource=st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]),
    quantity=hostile_quantities,
    raw=st.none() | hostile_numbers,
)
def test_hostile_quantities_are_answered_200_or_400_and_never_poison(
    client: FlaskClient, verb: str, resource: str, quantity: object, raw: str | None
) -> None:
    pod = make_pod("1", uid="fuzzed")
    pod["spec"]["containers"][0]["resources"]["requests"][resource] = "RAW" if raw else quantity
    doc: dict[str, Any] = {"Pod": pod}
    if verb == "preempt":
        doc["NodeNameToMetaVictims"] = {n: {"Pods": []} for n in NODES}
    else:
        doc["NodeNames"] = NODES
    body = orjson.dumps(doc)
    if raw:
        body = body.replace(b'"RAW"', raw.encode())
    reply = client.post(f"/scheduler/{verb}", data=body, content_type="application/json")
    assert reply.status_code in (200, 400), reply.data
    orjson.loads(reply.data)
    ledger = client.application.extensions["joulesched"]["extender"].predicted
    for uid in ("fuzzed",):
        placement = ledger.placement(uid)
        assert placement is None or (0 <= placement.cores <= 1e6 and 0 <= placement.gpus <= 1e4)


def test_node_gauges_are_written_only_for_profiled_nodes(make_app) -> None:  # type: ignore[no-untyped-def]
    app, _ = make_app()
    c = app.test_client()
    names = ["efficient"] + [f"made-up-{i}" for i in range(300)]
    status, _ = post(c, "prioritize", {"Pod": make_pod(), "NodeNames": names})
    assert status == 200
    app.extensions["joulesched"]["gauges"].write_once()
    text = c.get("/metrics").data.decode()
    assert 'joulesched_extender_node_score{node="efficient"}' in text
    assert "made-up-" not in text


def test_more_nodes_than_any_cluster_has_is_400_naming_the_limit(client: FlaskClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from joulesched.extender import wire

    assert wire.MAX_NODES >= 20_000  # four times the 5,000 nodes Kubernetes is tested to
    MAX_NODES = 100
    monkeypatch.setattr(wire, "MAX_NODES", MAX_NODES)
    names = [f"n{i}" for i in range(MAX_NODES + 1)]
    for body, where in (
        ({"Pod": make_pod(), "NodeNames": names}, "ExtenderArgs.NodeNames"),
        ({"Pod": make_pod(), "Nodes": {"items": [{"metadata": {"name": n}} for n in names]}}, "ExtenderArgs.Nodes.items"),
        ({"Pod": make_pod(), "NodeNameToMetaVictims": {n: {"Pods": []} for n in names}}, "NodeNameToMetaVictims"),
    ):
        verb = "preempt" if "NodeNameToMetaVictims" in body else "prioritize"
        status, reply = post(client, verb, body)
        assert status == 400 and where in reply["Error"] and f"more than the {MAX_NODES}" in reply["Error"]
    status, _ = post(client, "prioritize", {"Pod": make_pod(), "NodeNames": names[:MAX_NODES]})
    assert status == 200


def test_the_kept_decision_does_not_hold_the_request_s_node_objects(make_app) -> None:  # type: ignore[no-untyped-def]
    app, _ = make_app()
    c = app.test_client()
    status, _ = post(c, "filter", {"Pod": make_pod(), "Nodes": {"items": [make_node("efficient"), make_node("hungry")]}})
    last = app.extensions["joulesched"]["extender"].last
    assert status == 200 and last.args.nodes is None and last.args.node_names == ["efficient", "hungry"]


def test_node_series_of_nodes_gone_for_an_hour_are_evicted(make_app) -> None:  # type: ignore[no-untyped-def]
    from tests.support import Clock

    clock = Clock()
    app, _ = make_app(clock=clock)
    c = app.test_client()
    gauges = app.extensions["joulesched"]["gauges"]
    assert post(c, "prioritize", {"Pod": make_pod(), "NodeNames": ["efficient", "hungry"]})[0] == 200
    gauges.write_once()
    assert 'node_score{node="hungry"}' in c.get("/metrics").data.decode()
    clock.tick(1800)
    assert post(c, "prioritize", {"Pod": make_pod(), "NodeNames": ["efficient"]})[0] == 200
    gauges.write_once()
    assert 'node_score{node="hungry"}' in c.get("/metrics").data.decode()  # half an hour: kept
    clock.tick(1900)
    assert post(c, "prioritize", {"Pod": make_pod(), "NodeNames": ["efficient"]})[0] == 200
    gauges.write_once()
    text = c.get("/metrics").data.decode()
    assert 'node_score{node="efficient"}' in text
    assert 'node="hungry"' not in text
