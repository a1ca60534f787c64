"""The request bodies recorded from the real kube-scheduler v1.37.2 (tests/e2e/testdata/*.json),
read by extender/wire.py and answered by the in-process extender in the shape kube-scheduler
parses (tests/e2e/testdata/README.md):

* filter, ``nodeCacheCapable: true``  -> ``NodeNames`` (a list, never null);
* filter, ``nodeCacheCapable: false`` -> ``Nodes``, a NodeList whose items are the nodes sent;
* prioritize -> a bare JSON array of ``{"Host", "Score"}`` with integer scores in 0..10.

Runs without Go: the bodies are files.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from flask import Flask

from joulesched.extender import wire
from joulesched.extender.metrics import ExtenderMetrics
from tests.extender.support import CURVE, XEON

TESTDATA = Path(__file__).resolve().parents[1] / "e2e" / "testdata"
GOLDEN = sorted(TESTDATA.glob("extender_*_args_nodecachecapable_*.json"))
FILTER_RESULT_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


def sample_kind(path: Path) -> tuple[str, bool]:
    """(verb, nodeCacheCapable) from a name like extender_filter_args_nodecachecapable_true.json."""
    parts = path.stem.split("_")
    assert parts[0] == "extender" and parts[2] == "args" and parts[3] == "nodecachecapable", path.name
    assert parts[4] in ("true", "false"), path.name
    return parts[1], parts[4] == "true"


def expected_nodes(doc: dict[str, Any]) -> list[str]:
    if doc["Nodes"] is not None:
        return [n["metadata"]["name"] for n in doc["Nodes"]["items"]]
    return list(doc["NodeNames"])


def all_golden_nodes() -> list[str]:
    names: set[str] = set()
    for path in GOLDEN:
        names.update(expected_nodes(json.loads(path.read_bytes())))
    return sorted(names)


def test_every_verb_and_mode_has_a_golden_sample() -> None:
    # Guards the parametrisation below against an empty or partial glob.
    assert {sample_kind(p) for p in GOLDEN} == {
        ("filter", True),
        ("filter", False),
        ("prioritize", True),
        ("prioritize", False),
    }, [p.name for p in GOLDEN]


@pytest.fixture
def profiles_file(tmp_path: Path) -> Path:
    """Overrides support.profiles_file: profiles for the nodes named in the samples. The ``-a``
    nodes are efficient on a clean grid, the ``-b`` nodes hungry on a dirty one, so prioritize
    has real (not neutral) scores to order."""
    nodes = []
    for name in all_golden_nodes():
        if name.endswith("-a"):
            nodes.append({"name": name, "site": "clean", "cores": 64, "power_curve_watts": CURVE, "utilisation": 0.3})
        else:
            assert name.endswith("-b"), name
            nodes.append({"name": name, "site": "dirty", "cores": 80, "power_curve_watts": XEON, "utilisation": 0.3})
    doc = {
        "sites": {"clean": {"pue": 1.1, "carbon_intensity": 55}, "dirty": {"pue": 1.5, "carbon_intensity": 440}},
        "nodes": nodes,
    }
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_request_parses(path: Path) -> None:
    raw = path.read_bytes()
    doc = json.loads(raw)
    _, cache_capable = sample_kind(path)
    meta = doc["Pod"]["metadata"]
    names = expected_nodes(doc)
    assert len(names) == 2, names  # the recording used two nodes

    args = wire.parse_extender_args(raw)
    assert wire.pod_identity(args.pod) == (meta["namespace"], meta["name"], meta["uid"])
    assert args.pod["metadata"]["name"] == meta["name"]
    assert args.node_names == names
    assert args.node_cache_capable is cache_capable
    if cache_capable:
        assert doc["Nodes"] is None and args.nodes is None
    else:
        assert doc["NodeNames"] is None
        assert args.nodes.decoded() == doc["Nodes"]["items"]  # the full v1.Node objects, unchanged
        # On the wire kube-scheduler's encoding is compact (Go's encoding/json), and read
        # without decoding the nodes: the same pod, names and objects.
        compact = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
        scanned = wire._scan_scheduler_nodes(compact)
        assert scanned is not None
        assert (scanned.pod, scanned.node_names) == (args.pod, args.node_names)
        assert scanned.nodes.decoded() == doc["Nodes"]["items"]


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_request_is_answered_in_the_shape_kube_scheduler_reads(
    path: Path, make_app: Callable[..., tuple[Flask, ExtenderMetrics]]
) -> None:
    raw = path.read_bytes()
    doc = json.loads(raw)
    verb, cache_capable = sample_kind(path)
    names = expected_nodes(doc)
    app, metrics = make_app()
    reply = app.test_client().post(f"/scheduler/{verb}", data=raw, content_type="application/json")
    assert reply.status_code == 200, reply.data
    assert reply.mimetype == "application/json"
    body = orjson.loads(reply.data)
    assert metrics.registry is not None
    assert metrics.registry.get_sample_value("joulesched_extender_requests_total", {"verb": verb, "code": "200"}) == 1

    if verb == "filter":
        assert isinstance(body, dict) and set(body) == FILTER_RESULT_KEYS, body
        assert body["Error"] == ""
        assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}
        if cache_capable:
            # kube-scheduler reads NodeNames only; a null one would filter out every node.
            assert body["NodeNames"] == names
            assert body["Nodes"] is None
        else:
            # kube-scheduler reads Nodes only: a NodeList of the very objects it sent.
            nodes = body["Nodes"]
            assert isinstance(nodes, dict) and isinstance(nodes.get("items"), list), body
            assert [n["metadata"]["name"] for n in nodes["items"]] == names
            assert nodes["items"] == doc["Nodes"]["items"]
    else:
        assert verb == "prioritize"
        # HostPriorityList: a bare array, one entry per candidate, in input order.
        assert isinstance(body, list), body
        assert [set(entry) for entry in body] == [{"Host", "Score"}] * len(names), body
        assert [entry["Host"] for entry in body] == names
        scores = [entry["Score"] for entry in body]
        for score in scores:
            # int64 on the Go side: a JSON integer (1.0 would not decode), never a bool.
            assert type(score) is int, body
            assert wire.MIN_EXTENDER_PRIORITY <= score <= wire.MAX_EXTENDER_PRIORITY, body
        # The profiles make the -a node the cheaper place: the scores are the policy's, not neutral.
        by_host = dict(zip(names, scores, strict=True))
        a, b = sorted(names)
        assert by_host[a] > by_host[b], body
