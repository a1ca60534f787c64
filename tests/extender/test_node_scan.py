"""Nodes mode read without decoding the nodes (extender/wire.py, ``_scan_scheduler_nodes``).

kube-scheduler's own encoding of a Nodes-mode request is read by finding where each node
starts; everything else is decoded whole. Both must give the same pod, names, labels and
echo, and the scan must refuse (fall back) rather than misread anything that is not exactly
kube-scheduler's encoding.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import orjson
import pytest

from joulesched.extender import wire
from joulesched.extender.bench import full_node
from tests.extender.support import make_pod

LABEL = "joulesched.io/server-id"


@pytest.fixture(autouse=True)
def no_kept_lists() -> Any:
    """Each test starts with no node list read before (they are kept across requests)."""
    wire._LAST_NODE_LISTS.clear()
    yield
    wire._LAST_NODE_LISTS.clear()


def scheduler_body(items: list[dict[str, Any]], pod: dict[str, Any] | None = None) -> bytes:
    """What kube-scheduler POSTs (Go's encoding/json: compact, fields in declaration order)."""
    doc = {"Pod": pod or make_pod(), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def decoded_whole(body: bytes) -> wire.ExtenderArgs:
    """The general reader's answer for the same body (re-encoded so the scan does not apply)."""
    doc = orjson.loads(body)
    doc["Nodes"]["kind"] = "NodeList"
    return wire.parse_extender_args(orjson.dumps(doc))


def tricky_nodes(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Nodes whose strings hold what the scan looks for, escaped as JSON strings are."""
    items = []
    for i in range(n):
        node = full_node(i)
        meta = node["metadata"]
        if rng.random() < 0.5:
            meta["annotations"]["note"] = '},{"metadata":{"name":"ghost"},"metadata":{'
        if rng.random() < 0.3:
            meta["labels"][LABEL] = f"srv-{i}"
        if rng.random() < 0.2:
            meta["annotations"][LABEL] = "not the label"
        if rng.random() < 0.2:
            meta["name"] = f'odd"name\\{i}é'  # not a DNS name, but JSON: escapes in the name
        node["status"]["images"] = node["status"]["images"][: rng.randrange(0, 4)]
        items.append(node)
    return items


@pytest.mark.parametrize("seed", range(20))
def test_the_scan_reads_what_decoding_the_whole_body_reads(seed: int) -> None:
    rng = random.Random(seed)
    items = tricky_nodes(rng, rng.randrange(0, 12))
    body = scheduler_body(items)
    scanned = wire._scan_scheduler_nodes(body)
    assert scanned is not None
    whole = decoded_whole(body)
    assert scanned.pod == whole.pod
    assert scanned.node_names == whole.node_names == [n["metadata"]["name"] for n in items]
    assert scanned.nodes is not None and whole.nodes is not None
    assert scanned.nodes.decoded() == whole.nodes.decoded() == items
    for i, node in enumerate(items):
        assert scanned.nodes.label(i, LABEL) == whole.nodes.label(i, LABEL) == node["metadata"]["labels"].get(LABEL)
    assert scanned.nodes.carries(LABEL) or not any(LABEL in n["metadata"]["labels"] for n in items)
    passed = sorted(rng.sample(range(len(items)), rng.randrange(0, len(items) + 1)))
    for args in (scanned, whole):
        reply = orjson.loads(bytes(wire.filter_result(args, passed, {}, {"x": "y"})))
        assert reply["Nodes"]["items"] == [items[i] for i in passed]
        assert reply["NodeNames"] == [items[i]["metadata"]["name"] for i in passed]
        assert reply["FailedAndUnresolvableNodes"] == {"x": "y"} and reply["Error"] == ""


def test_the_echo_is_the_bytes_kube_scheduler_sent() -> None:
    items = [full_node(i) for i in range(3)]
    body = scheduler_body(items)
    args = wire.parse_extender_args(body)
    assert args.nodes is not None
    everything = bytes(wire.filter_result(args, [0, 1, 2], {}, {}))
    assert body[body.index(b'"items":[') + 9 : body.rindex(b"]},")] in everything
    some = bytes(wire.filter_result(args, [0, 2], {}, {}))
    for i in (0, 2):
        assert json.dumps(items[i], separators=(",", ":")).encode() in some


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.replace(b'"Nodes":{"metadata":{},', b'"Nodes":{"kind":"NodeList","metadata":{},'),
        lambda b: b.replace(b',"NodeNames":null}', b"}"),
        lambda b: b.replace(b'{"Pod":', b'{ "Pod":'),
        lambda b: b.replace(b'{"metadata":{"name":"node-00001"', b'{"kind":"Node","metadata":{"name":"node-00001"'),
        lambda b: b.replace(b'{"metadata":{"name":"node-00001",', b'{"metadata":{'),  # a node without a name
        lambda b: b.replace(b'"Nodes":{"metadata":{},', b'"Nodes":{"metadata":{},"x":{"metadata":{}},'),
        lambda b: b.replace(b'},{"metadata":{"name":"node-00002"', b'},{"spec":{},"metadata":{"name":"node-00002"'),
    ],
    ids=["NodeList kind", "no NodeNames", "whitespace", "a node with kind first", "a node without name", "an extra key", "a node the scan cannot see start"],
)
def test_a_body_not_in_kube_schedulers_encoding_is_decoded_whole(change: Any) -> None:
    body = change(scheduler_body([full_node(i) for i in range(3)]))
    assert wire._scan_scheduler_nodes(body) is None
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if b'{"metadata":{"uid"' in body:
        with pytest.raises(wire.WireError, match=r"Nodes.items\[1\].metadata.name"):
            wire.parse_extender_args(body)
    else:
        args = wire.parse_extender_args(body)
        assert args.node_names == [full_node(i)["metadata"]["name"] for i in range(3)]


def test_a_malformed_body_in_kube_schedulers_shape_is_a_wire_error_naming_it() -> None:
    body = scheduler_body([full_node(0)])
    broken = body.replace(b'"status":{', b'"status":{,', 1)
    with pytest.raises(wire.WireError, match="request body is not valid JSON"):
        wire.parse_extender_args(broken)
    wire.parse_extender_args(body)  # valid, and now known valid
    with pytest.raises(wire.WireError, match="request body is not valid JSON"):
        wire.parse_extender_args(broken)  # still refused: what is known valid is bytes, not names
    assert wire._scan_scheduler_nodes(broken) is None
    same_length = body.replace(b'"status":{"', b'"status":{,', 1)  # as long as a node kept valid
    assert len(same_length) == len(body)
    with pytest.raises(wire.WireError, match="request body is not valid JSON"):
        wire.parse_extender_args(same_length)
    no_pod = body.replace(b'{"Pod":' + orjson.dumps(make_pod()), b'{"Pod":null', 1)
    with pytest.raises(wire.WireError, match=r"ExtenderArgs.Pod: required"):
        wire.parse_extender_args(no_pod)
    too_many = scheduler_body([{"metadata": {"name": f"n{i}"}} for i in range(wire.MAX_NODES + 1)])
    with pytest.raises(wire.WireError, match="more than the"):
        wire.parse_extender_args(too_many)


def test_a_node_list_read_before_is_not_read_again_and_a_changed_one_is() -> None:
    items = [full_node(i) for i in range(4)]
    items[2]["metadata"]["labels"][LABEL] = "srv-1"
    first = scheduler_body(items)
    changed = first.replace(b'"srv-1"', b'"srv-2"')  # same length, one node differs
    assert len(changed) == len(first)
    for body, server in ((first, "srv-1"), (changed, "srv-2"), (first, "srv-1")):
        for _ in range(2):  # the second time from the kept list
            args = wire.parse_extender_args(bytearray(body), LABEL)
            assert args.nodes is not None and args.nodes.label(2, LABEL) == server
            assert args.nodes.decoded()[2]["metadata"]["labels"][LABEL] == server
            echoed = orjson.loads(bytes(wire.filter_result(args, [1, 2], {}, {})))["Nodes"]["items"]
            assert echoed[1]["metadata"]["labels"][LABEL] == server
    other_pod = scheduler_body(items, pod={**make_pod(), "metadata": {"name": "other", "namespace": "default", "uid": "u2"}})
    args = wire.parse_extender_args(other_pod, LABEL)  # same nodes, another pod: the pod is its own
    assert wire.pod_identity(args.pod) == ("default", "other", "u2")


@pytest.mark.parametrize(
    "node, expected",
    [
        (b'{"metadata":{"name":"a"},"metadata":5}', "Nodes.items[0].metadata.name: required string"),
        (b'{"metadata":{"name":"a"},"metadata":null}', "Nodes.items[0].metadata.name: required string"),
        (b'{"metadata":{"name":"a"},"metadata":{}}', "Nodes.items[0].metadata.name: required string"),
        (b'{"metadata":{"name":"","name":"x"}}', None),  # the last key wins, as in Go: node x
    ],
    ids=["metadata repeated: a number", "metadata repeated: null", "metadata repeated: empty", "name repeated"],
)
def test_repeated_keys_are_read_as_decoding_the_whole_body_reads_them(node: bytes, expected: str | None) -> None:
    body = b'{"Pod":' + orjson.dumps(make_pod()) + b',"Nodes":{"metadata":{},"items":[' + node + b']},"NodeNames":null}'
    if expected is None:
        assert wire.parse_extender_args(body).node_names == ["x"]
    else:
        with pytest.raises(wire.WireError, match=re.escape(expected)):
            wire.parse_extender_args(body)


def test_gos_escapes_read_as_decoding_reads_them() -> None:
    """Go's encoder writes <, >, & and U+2028/2029 as \\u escapes (json.Marshal's HTML safety)."""
    node = full_node(0)
    node["metadata"]["labels"][LABEL] = "a<b>&c\u2028"
    node["metadata"]["annotations"]["x"] = "</script>"
    raw = scheduler_body([node, full_node(1)])
    go = raw.replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(b"&", b"\\u0026")
    args = wire.parse_extender_args(go, LABEL)
    assert args.nodes is not None
    assert args.nodes.label(0, LABEL) == "a<b>&c\u2028"
    assert args.nodes.decoded() == [node, full_node(1)]
    assert go[go.index(b'"items":[') + 9 : go.rindex(b"]},")] in bytes(wire.filter_result(args, [0, 1], {}, {}))


def test_a_kept_list_is_used_only_where_it_answers_the_same_question(monkeypatch: pytest.MonkeyPatch) -> None:
    items = [full_node(i) for i in range(3)]
    items[1]["metadata"]["labels"][LABEL] = "srv-x"
    body = scheduler_body(items)
    assert wire.parse_extender_args(body).nodes.label(1, LABEL) == "srv-x"  # type: ignore[union-attr]
    # Kept without the label: a request asking for it reads the nodes again.
    args = wire.parse_extender_args(body, LABEL)
    assert args.nodes is not None and args.nodes.label(1, LABEL) == "srv-x" and args.nodes.carries(LABEL)
    # Kept with it: the same list, under another pod (so at another offset), is compared, not read.
    calls = []
    monkeypatch.setattr(wire, "_known_nodes", lambda *a: calls.append(a))
    other = scheduler_body(items, pod={**make_pod(), "metadata": {"name": "a-longer-name", "namespace": "x", "uid": "u9"}})
    args = wire.parse_extender_args(other, LABEL)
    assert calls == []
    assert wire.pod_identity(args.pod) == ("x", "a-longer-name", "u9")
    assert args.node_names == [n["metadata"]["name"] for n in items]
    assert args.nodes is not None and args.nodes.decoded() == items
    assert [args.nodes.label(i, LABEL) for i in range(3)] == [None, "srv-x", None]
    assert orjson.loads(bytes(wire.filter_result(args, [0, 1, 2], {}, {})))["Nodes"]["items"] == items
    assert orjson.loads(bytes(wire.filter_result(args, [2], {}, {})))["Nodes"]["items"] == [items[2]]
