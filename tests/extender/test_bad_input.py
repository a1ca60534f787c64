"""Bad input: a clear 400 with a JSON error naming what is wrong; never a crash, never a hang."""

from __future__ import annotations

import json

import orjson
import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.extender.support import make_pod, post

VERBS = ["filter", "prioritize", "explain", "preempt", "bind"]


@pytest.mark.parametrize(
    ("verb", "body", "message"),
    [
        ("prioritize", b"", "empty request body"),
        ("prioritize", b"{not json", "not valid JSON"),
        ("filter", b"[1, 2]", "ExtenderArgs: must be a JSON object, got array"),
        ("filter", {"NodeNames": ["a"]}, "ExtenderArgs.Pod: required"),
        ("filter", {"Pod": "p", "NodeNames": ["a"]}, "ExtenderArgs.Pod: must be a JSON object, got string"),
        ("filter", {"Pod": make_pod()}, "one of NodeNames (nodeCacheCapable: true) or Nodes"),
        ("prioritize", {"Pod": make_pod(), "NodeNames": "a,b"}, "ExtenderArgs.NodeNames: must be an array of strings"),
        ("prioritize", {"Pod": make_pod(), "NodeNames": ["a", 7]}, "ExtenderArgs.NodeNames[1]: must be a string"),
        ("prioritize", {"Pod": make_pod(), "Nodes": {"items": [{"metadata": {}}]}}, "Nodes.items[0].metadata.name"),
        ("prioritize", {"Pod": make_pod("two"), "NodeNames": ["a"]}, "Pod.spec.containers[0].resources.requests[cpu]"),
        ("bind", {"PodName": "p", "PodNamespace": "ns", "PodUID": "u"}, "ExtenderBindingArgs.Node: required"),
        ("preempt", {"Pod": make_pod(), "NodeNameToMetaVictims": {"a": {"Pods": [{}]}}}, "Pods[0].UID: required"),
        (
            "preempt",
            {"Pod": make_pod(), "NodeNameToMetaVictims": {"a": {"Pods": [], "NumPDBViolations": "1"}}},
            "NumPDBViolations: must be an integer",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None,
)
def test_bad_requests_get_400_naming_the_field(client: FlaskClient, verb: str, body: object, message: str) -> None:
    status, reply = post(client, verb, body)
    assert status == 400
    assert message in reply["Error"]


def test_unknown_verb_and_wrong_method(client: FlaskClient) -> None:
    status, reply = post(client, "score", {"Pod": make_pod(), "NodeNames": []})
    assert status == 404 and "unknown verb 'score'" in reply["Error"]
    reply = client.get("/scheduler/prioritize")
    assert reply.status_code == 405 and b"take POST" in reply.data
    reply = client.get("/nowhere")
    assert reply.status_code == 404 and orjson.loads(reply.data)["Error"].startswith("no such path")


def test_body_over_the_limit_is_413_before_it_is_read(make_app) -> None:  # type: ignore[no-untyped-def]
    app, _ = make_app({"max_request_bytes": 2048})
    c = app.test_client()
    big = orjson.dumps({"Pod": make_pod(), "NodeNames": [f"node-{i}" for i in range(500)]})
    status, reply = post(c, "prioritize", big)
    assert status == 413 and "max_request_bytes (2048)" in reply["Error"]
    text = c.get("/metrics").data.decode()
    assert 'joulesched_extender_failures_total{reason="too_large",verb="prioritize"} 1.0' in text


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
pods = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.dictionaries(st.sampled_from(["name", "uid", "namespace", "annotations"]), json_values),
        "spec": st.dictionaries(st.sampled_from(["containers", "initContainers", "overhead"]), json_values)
        | json_values,
    },
)
bodies = st.one_of(
    st.binary(max_size=64),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {},
        optional={
            "Pod": pods | json_values,
            "NodeNames": st.lists(st.text(max_size=6) | json_values, max_size=5) | json_values,
            "Nodes": st.fixed_dictionaries({"items": st.lists(json_values, max_size=3)}) | json_values,
            "NodeNameToMetaVictims": st.dictionaries(st.text(max_size=4), json_values, max_size=2),
            "PodName": json_values,
            "Node": json_values,
        },
    ).map(lambda v: json.dumps(v).encode()),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(verb=st.sampled_from(VERBS), body=bodies)
def test_fuzzed_requests_never_crash_and_are_answered_200_or_400(client: FlaskClient, verb: str, body: bytes) -> None:
    reply = client.post(f"/scheduler/{verb}", data=body, content_type="application/json")
    assert reply.status_code in (200, 400, 404), reply.data
    payload = orjson.loads(reply.data)
    if reply.status_code != 200:
        assert isinstance(payload["Error"], str) and payload["Error"]
    elif verb == "prioritize":
        assert all(type(h["Score"]) is int and 0 <= h["Score"] <= 10 for h in payload)
    elif verb == "filter":
        assert payload["NodeNames"] is not None
        sent = json.loads(body)
        nodes = sent.get("Nodes")
        names = sent.get("NodeNames") if nodes is None else [n["metadata"]["name"] for n in nodes.get("items") or []]
        assert set(payload["NodeNames"]) <= set(names)
