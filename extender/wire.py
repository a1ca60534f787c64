"""The kube-scheduler extender protocol, exactly as kube-scheduler sends and parses it.

Source of every type: ``k8s.io/kube-scheduler/extender/v1/types.go`` (staging module of
k8s.io/kubernetes; unchanged in shape since 1.19). The Go structs carry no json tags, so the
JSON keys are the Go field names:

* ``ExtenderArgs{Pod *v1.Pod; Nodes *v1.NodeList; NodeNames *[]string}`` — the body of filter,
  prioritize (and our explain). ``Nodes`` is sent when the extender is configured with
  ``nodeCacheCapable: false``, ``NodeNames`` when ``true``.
* ``ExtenderFilterResult{Nodes *v1.NodeList; NodeNames *[]string; FailedNodes FailedNodesMap;
  FailedAndUnresolvableNodes FailedNodesMap; Error string}``. kube-scheduler reads
  ``NodeNames`` when nodeCacheCapable, else ``Nodes``; a null one means "no node passed".
* ``HostPriorityList []HostPriority``, ``HostPriority{Host string; Score int64}`` — prioritize
  answers a bare JSON array; scores are integers in [MinExtenderPriority=0,
  MaxExtenderPriority=10].
* ``ExtenderBindingArgs{PodName, PodNamespace string; PodUID types.UID; Node string}``,
  ``ExtenderBindingResult{Error string}``.
* ``ExtenderPreemptionArgs{Pod *v1.Pod; NodeNameToVictims map[string]*Victims;
  NodeNameToMetaVictims map[string]*MetaVictims}``, ``ExtenderPreemptionResult{
  NodeNameToMetaVictims map[string]*MetaVictims}``, ``Victims{Pods []*v1.Pod;
  NumPDBViolations int64}``, ``MetaVictims{Pods []*MetaPod; NumPDBViolations int64}``,
  ``MetaPod{UID string}``.

Go's ``encoding/json`` matches object keys case-insensitively when no key matches exactly, and
ignores unknown keys; the readers here do the same, so a body Go would accept is accepted.
Everything else (not JSON, wrong types, a missing pod) is a :class:`WireError` whose message
names the field.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import orjson

from joulesched.extender.errors import WireError

MIN_EXTENDER_PRIORITY = 0
MAX_EXTENDER_PRIORITY = 10
# Four times the 5,000 nodes Kubernetes is tested to. A candidate costs a worker about 1 KB
# while it is scored (docs/benchmarks.md, "Memory"), so this bounds a request at ~25 MB
# whatever its bytes: 16 MiB of short names (1.2 million) would otherwise take gigabytes, and
# four such requests at once (one per thread) must fit the pod's memory limit.
MAX_NODES = 20_000


# The HTTP status lines of the verbs' replies (the worker writes them itself, extender/worker.py).
REASONS = {200: "200 OK", 400: "400 Bad Request", 404: "404 Not Found", 413: "413 Content Too Large", 500: "500 Internal Server Error"}


class Encoded(bytes):
    """A reply already serialised (the HTTP layer sends it as it is)."""


def decode(body: bytes) -> Any:
    if not body:
        raise WireError("empty request body: expected a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise WireError(f"request body is not valid JSON: {err}") from err


def field(doc: Mapping[str, Any], name: str) -> Any:
    """``doc[name]`` the way Go's decoder finds it: exact key first, then case-insensitively."""
    if name in doc:
        return doc[name]
    folded = name.casefold()
    for key, value in doc.items():
        if isinstance(key, str) and key.casefold() == folded:
            return value
    return None


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise WireError(f"{where}: must be a JSON object, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), type(value).__name__
    )


def _pod(doc: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    pod = field(doc, "Pod")
    if pod is None:
        raise WireError(f"{where}.Pod: required (the pod being scheduled)")
    pod = _object(pod, f"{where}.Pod")
    meta = pod.get("metadata")
    if meta is not None and not isinstance(meta, Mapping):
        raise WireError(f"{where}.Pod.metadata: must be a JSON object, got {_kind(meta)}")
    if meta:
        for key in ("name", "namespace", "uid"):
            value = meta.get(key)
            if value is not None and not isinstance(value, str):
                raise WireError(f"{where}.Pod.metadata.{key}: must be a string, got {_kind(value)}")
    return pod


class NodeObjects:
    """The v1.Node objects of a Nodes-mode request (``nodeCacheCapable: false``).

    From kube-scheduler each node is kept as the bytes it arrived in, so that filter echoes
    the passing nodes back unchanged without building or re-encoding them: of a 1,000-node
    request (3 MB) the policy needs the names, and the labels only of nodes that carry
    ``joulesched.io/server-id``. From another encoding (decoded whole) the objects are kept
    and encoded when echoed.
    """

    __slots__ = ("_base", "_body", "_bounds", "_key", "_parsed", "_values")

    def __init__(
        self,
        body: bytes | bytearray = b"",
        bounds: Sequence[tuple[int, int]] = (),
        parsed: list[Mapping[str, Any]] | None = None,
        key: str | None = None,
        values: Sequence[str | None] = (),
        base: int = 0,
    ) -> None:
        self._body = body  # the request, as it came
        self._base = base
        self._bounds = bounds  # where each node's JSON object starts and ends in it, from base
        self._parsed = parsed  # or the decoded objects
        self._key = key  # a label read with the scan: each node's value of it, in values
        self._values = values

    def __len__(self) -> int:
        return len(self._bounds) if self._parsed is None else len(self._parsed)

    def decoded(self) -> list[Mapping[str, Any]]:
        """The objects, decoded (tests, and nothing on the hot path)."""
        if self._parsed is None:
            view = memoryview(self._body)[self._base :]
            return [orjson.loads(view[s:e]) for s, e in self._bounds]
        return list(self._parsed)

    def carries(self, key: str) -> bool:
        """Whether any node may carry label ``key`` (False: none does)."""
        if self._parsed is not None or not self._bounds:
            return self._parsed is not None
        if key == self._key:
            return self._values.count(None) != len(self._values)
        return True  # not read with the scan: maybe

    def label(self, i: int, key: str) -> str | None:
        """Node ``i``'s label ``key`` (a string), or None."""
        if self._parsed is None:
            if key == self._key:
                return self._values[i]
            s, e = self._bounds[i]
            node = orjson.loads(memoryview(self._body)[self._base + s : self._base + e])
        else:
            node = self._parsed[i]
        meta = node.get("metadata")
        labels = meta.get("labels") if isinstance(meta, Mapping) else None
        value = labels.get(key) if isinstance(labels, Mapping) else None
        return value if isinstance(value, str) else None

    def echo(self, positions: list[int]) -> bytes | memoryview:
        """The comma-separated JSON of the nodes at ``positions``."""
        if self._parsed is None:
            bounds = self._bounds
            view = memoryview(self._body)[self._base :]
            if len(positions) == len(bounds):  # every node: one slice
                return view[bounds[0][0] : bounds[-1][1]] if bounds else b""
            return b",".join(view[bounds[i][0] : bounds[i][1]] for i in positions)
        out = []
        for i in positions:
            try:
                out.append(orjson.dumps(self._parsed[i]))
            except orjson.JSONEncodeError as err:
                raise WireError(f"ExtenderArgs.Nodes.items[{i}]: cannot be echoed back: {err}") from None
        return b",".join(out)


@dataclass(frozen=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    node_names: list[str]
    nodes: NodeObjects | None  # the full v1.Node objects when sent (nodeCacheCapable: false)

    @property
    def node_cache_capable(self) -> bool:
        return self.nodes is None


# kube-scheduler's encoding of a Nodes-mode ExtenderArgs (Go's encoding/json, compact, fields in
# declaration order; tests/e2e/testdata/README.md): the NodeList without kind/apiVersion or list
# metadata, NodeNames null, every node's first key its metadata and that one's its name.
_SCHEDULER_HEAD = b'{"Pod":'
_SCHEDULER_NODES = b',"Nodes":{"metadata":{},"items":['
_SCHEDULER_TAIL = b']},"NodeNames":null}'
_NODE_START = b'{"metadata":{"name":"'
_STRING_REST = re.compile(rb'((?:[^"\\]|\\.)*)"')  # a JSON string's content and closing quote


def _scan_scheduler_nodes(body: bytes, label: str | None = None) -> ExtenderArgs | None:
    """A Nodes-mode body in kube-scheduler's encoding, read without decoding the nodes.

    The pod is decoded; of each node, where it starts and its name are read, and its bytes
    are checked to be one valid node object (decoded unless they are a node's of a list read
    before, see :func:`_known_nodes`). None when the body is not exactly that encoding (another client's,
    another key order, whitespace) or anything in it is malformed: then
    :func:`parse_extender_args` decodes it whole, and names what is wrong. Sound because within
    a JSON string every quote is escaped, so ``{"metadata":{"name":"`` occurs only where an
    object starts, and a v1.Node holds no object whose first key is ``metadata`` but itself;
    a node the scan missed would leave two objects in one span, which the check refuses.
    Each node's value of ``label``, if given, is read when the node is decoded, and kept
    with the list.
    """
    if not body.startswith(_SCHEDULER_HEAD) or not body.endswith(_SCHEDULER_TAIL):
        return None
    split = body.find(_SCHEDULER_NODES)
    if split < 0:
        return None
    try:
        doc = orjson.loads(memoryview(body)[:split].tobytes() + b"}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or len(doc) != 1 or not _pod_is_valid(doc):
        return None
    begin, end = split + len(_SCHEDULER_NODES), len(body) - len(_SCHEDULER_TAIL)
    for seen in tuple(_LAST_NODE_LISTS):  # the same nodes as a request just read: nothing to scan
        if seen.label == label and len(seen.data) == end - begin and body.startswith(seen.data, begin):
            nodes = NodeObjects(body, seen.bounds, key=label, values=seen.values, base=begin)
            return ExtenderArgs(doc["Pod"], list(seen.names), nodes)
    starts: list[int] = []
    names: list[str] = []
    find = body.find
    at = find(_NODE_START, begin, end)
    while at >= 0:
        first = at + len(_NODE_START)
        close = find(b'"', first, end)
        if close < 0:
            return None
        raw = body[first:close]
        try:
            if b"\\" in raw:  # escapes: the quote found may be one of them
                m = _STRING_REST.match(body, first, end)
                if m is None:
                    return None
                close = m.end() - 1
                name = orjson.loads(b'"' + m.group(1) + b'"')
            else:
                name = raw.decode()
        except (orjson.JSONDecodeError, UnicodeDecodeError):
            return None
        if not name or len(starts) == MAX_NODES:
            return None  # decoded whole, which names the problem
        starts.append(at)
        names.append(name)
        at = find(_NODE_START, close, end)
    if not starts:
        return None if begin != end else ExtenderArgs(doc["Pod"], [], NodeObjects(key=label))
    if starts[0] != begin or body[end - 1] != ord("}") or any(body[s - 2 : s] != b"}," for s in starts[1:]):
        return None
    bounds = list(zip(starts, [*(s - 1 for s in starts[1:]), end], strict=True))
    values = _known_nodes(body, bounds, names, label)
    if values is None:
        return None
    pod = doc["Pod"]
    relative = [(s - begin, e - begin) for s, e in bounds]
    kept = _NodeList(memoryview(body)[begin:end].tobytes(), label, tuple(names), relative, values, {name: i for i, name in enumerate(names)})
    _LAST_NODE_LISTS.appendleft(kept)
    return ExtenderArgs(pod, names, NodeObjects(body, relative, key=label, values=values, base=begin))


@dataclass(frozen=True)
class _NodeList:
    """The node list of a request read by the scan: its bytes, and what was read of them."""

    data: bytes
    label: str | None
    names: tuple[str, ...]
    bounds: list[tuple[int, int]]  # from the list's start
    values: list[str | None]
    where: dict[str, int]  # name -> position


# The node lists of the last two requests read by the scan (filter's and prioritize's differ
# when a node is filtered out). kube-scheduler sends the same bytes with every pod until a node
# changes: a list compared whole costs a tenth of reading it, and a node compared with its
# bytes in a kept list costs no decoding. At most 2 × the list is kept.
_LAST_NODE_LISTS: deque[_NodeList] = deque(maxlen=2)


def _pod_is_valid(doc: Mapping[str, Any]) -> bool:
    try:
        _pod(doc, "ExtenderArgs")
    except WireError:
        return False
    return True


def _known_nodes(body: bytes, bounds: list[tuple[int, int]], names: list[str], label: str | None) -> list[str | None] | None:
    """Each node's value of ``label``, once every span is known to be one node object of that
    name (None: one is not, and the body is decoded whole).

    A node whose bytes are those of the node of that name in a list read before is known; any
    other is decoded (a node that changed, or a list never seen). kube-scheduler resends every
    node with every pod, and a node's object changes every few minutes at most (its status
    report), so most requests decode a few nodes, or none.
    """
    view = memoryview(body)
    seen = [kept for kept in tuple(_LAST_NODE_LISTS) if kept.label == label]  # another thread may add one
    values: list[str | None] = []
    for i, (s, e) in enumerate(bounds):
        name = names[i]
        for kept in seen:
            j = kept.where.get(name)
            if j is not None:
                ks, ke = kept.bounds[j]
                if ke - ks == e - s and body.startswith(memoryview(kept.data)[ks:ke], s):  # a memcmp
                    values.append(kept.values[j])
                    break
        else:
            try:
                node = orjson.loads(view[s:e])
            except orjson.JSONDecodeError:
                return None  # malformed, or two objects where the scan saw one
            meta = node.get("metadata")
            if not isinstance(meta, dict) or meta.get("name") != name:
                return None  # a repeated key, or not the name the scan read: decoded whole
            labels = meta.get("labels")
            value = labels.get(label) if label is not None and isinstance(labels, dict) else None
            values.append(value if isinstance(value, str) else None)
    return values


def parse_extender_args(body: bytes, label: str | None = None) -> ExtenderArgs:
    """The request; in Nodes mode, ``label`` is a node label the caller will ask each node for."""
    scanned = _scan_scheduler_nodes(body, label)
    if scanned is not None:
        return scanned
    doc = _object(decode(body), "ExtenderArgs")
    pod = _pod(doc, "ExtenderArgs")
    names_value = field(doc, "NodeNames")
    nodes_value = field(doc, "Nodes")
    if nodes_value is not None:
        node_list = _object(nodes_value, "ExtenderArgs.Nodes")
        items = node_list.get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise WireError(f"ExtenderArgs.Nodes.items: must be an array, got {_kind(items)}")
        _check_count(len(items), "ExtenderArgs.Nodes.items")
        names: list[str] = []
        for i, node in enumerate(items):
            node = _object(node, f"ExtenderArgs.Nodes.items[{i}]")
            meta = node.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if not isinstance(name, str) or not name:
                raise WireError(f"ExtenderArgs.Nodes.items[{i}].metadata.name: required string")
            names.append(name)
        return ExtenderArgs(pod, names, NodeObjects(parsed=items))
    if names_value is not None:
        if not isinstance(names_value, list):
            raise WireError(f"ExtenderArgs.NodeNames: must be an array of strings, got {_kind(names_value)}")
        _check_count(len(names_value), "ExtenderArgs.NodeNames")
        try:
            "".join(names_value)  # every entry a string, in one C-level pass (a fifth of a set of types')
        except TypeError:
            for i, name in enumerate(names_value):
                if not isinstance(name, str):
                    raise WireError(f"ExtenderArgs.NodeNames[{i}]: must be a string, got {_kind(name)}") from None
            raise
        return ExtenderArgs(pod, names_value, None)
    raise WireError(
        "ExtenderArgs: one of NodeNames (nodeCacheCapable: true) or Nodes (nodeCacheCapable: false) is required"
    )


def _check_count(count: int, where: str) -> None:
    if count > MAX_NODES:
        raise WireError(f"{where}: {count} nodes, more than the {MAX_NODES} a request may name")


def filter_result(
    args: ExtenderArgs, passed: list[int], failed: dict[str, str], unresolvable: dict[str, str]
) -> dict[str, Any] | Encoded:
    """``ExtenderFilterResult`` for the candidates at positions ``passed``.

    ``NodeNames`` is always a list (never null: a null NodeNames filters out every node in
    nodeCacheCapable mode). In Nodes mode the passing node objects are echoed as they came, and
    the reply is returned encoded.
    """
    names = args.node_names if len(passed) == len(args.node_names) else list(map(args.node_names.__getitem__, passed))
    result: dict[str, Any] = {
        "NodeNames": names,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }
    if args.nodes is None:
        return {"Nodes": None, **result}
    head = b'{"Nodes":{"apiVersion":"v1","kind":"NodeList","metadata":{},"items":['
    return Encoded(b"".join((head, args.nodes.echo(passed), b"]},", memoryview(orjson.dumps(result))[1:])))


def host_priority_list(names: list[str], scores: list[int]) -> list[dict[str, Any]]:
    """``HostPriorityList``: a bare array, one integer score per candidate, in input order."""
    return [{"Host": name, "Score": score} for name, score in zip(names, scores, strict=True)]


# Between one candidate's escaped name and the next's, for each score a reply can hold.
_BETWEEN = tuple(b'","Score":%d},{"Host":"' % score for score in range(101))


def encode_host_priority_list(names: list[str], scores: np.ndarray | Sequence[int]) -> Encoded:
    """``orjson.dumps(host_priority_list(names, scores))``, without a dict a candidate.

    The names are escaped by orjson in one call and cut apart where one string ends and the
    next begins, and the scores go in between (docs/benchmarks.md, "Fewer Python objects a
    decision"). Where no escaped name holds a backslash, none holds a quote (a Kubernetes node
    name never does), so ``","`` occurs only between two strings; otherwise — a name ending in
    ``",`` would be cut inside — the list of dicts is encoded instead, as it is for fewer than
    three candidates.
    """
    values = np.asarray(scores)
    if len(names) != len(values):
        raise ValueError(f"{len(names)} candidates but {len(values)} scores")
    escaped = orjson.dumps(names)
    if len(names) < 3 or values.min() < 0 or values.max() >= len(_BETWEEN) or b"\\" in escaped:
        return Encoded(orjson.dumps(host_priority_list(names, values.tolist())))
    listed = values.tolist()
    chunks = [b""] * (2 * len(names) - 1)
    chunks[0::2] = escaped[2:-2].split(b'","')
    chunks[1::2] = itemgetter(*listed[:-1])(_BETWEEN)  # (a tuple: two scores at least)
    return Encoded(b'[{"Host":"%b","Score":%d}]' % (b"".join(chunks), listed[-1]))


@dataclass(frozen=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def parse_binding_args(body: bytes) -> BindingArgs:
    doc = _object(decode(body), "ExtenderBindingArgs")
    values: dict[str, str] = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = field(doc, key)
        if not isinstance(value, str) or (not value and key != "PodUID"):
            raise WireError(f"ExtenderBindingArgs.{key}: required non-empty string, got {_kind(value)}")
        values[key] = value
    return BindingArgs(values["PodName"], values["PodNamespace"], values["PodUID"], values["Node"])


@dataclass(frozen=True)
class PreemptionArgs:
    pod: Mapping[str, Any]
    # node name -> (victim pod UIDs, NumPDBViolations), from whichever map was sent
    victims: dict[str, tuple[list[str], int]]


def _violations(value: Any, where: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{where}.NumPDBViolations: must be an integer, got {_kind(value)}")
    return value


def parse_preemption_args(body: bytes) -> PreemptionArgs:
    doc = _object(decode(body), "ExtenderPreemptionArgs")
    pod = _pod(doc, "ExtenderPreemptionArgs")
    victims: dict[str, tuple[list[str], int]] = {}
    meta_map = field(doc, "NodeNameToMetaVictims")
    full_map = field(doc, "NodeNameToVictims")
    if meta_map is not None:
        meta_map = _object(meta_map, "ExtenderPreemptionArgs.NodeNameToMetaVictims")
        _check_count(len(meta_map), "ExtenderPreemptionArgs.NodeNameToMetaVictims")
        for node, entry in meta_map.items():
            where = f"ExtenderPreemptionArgs.NodeNameToMetaVictims[{node}]"
            entry = _object(entry, where)
            pods = field(entry, "Pods") or []
            if not isinstance(pods, list):
                raise WireError(f"{where}.Pods: must be an array")
            uids = []
            for i, p in enumerate(pods):
                uid = field(_object(p, f"{where}.Pods[{i}]"), "UID")
                if not isinstance(uid, str):
                    raise WireError(f"{where}.Pods[{i}].UID: required string")
                uids.append(uid)
            victims[node] = (uids, _violations(field(entry, "NumPDBViolations"), where))
    elif full_map is not None:
        full_map = _object(full_map, "ExtenderPreemptionArgs.NodeNameToVictims")
        _check_count(len(full_map), "ExtenderPreemptionArgs.NodeNameToVictims")
        for node, entry in full_map.items():
            where = f"ExtenderPreemptionArgs.NodeNameToVictims[{node}]"
            entry = _object(entry, where)
            pods = field(entry, "Pods") or []
            if not isinstance(pods, list):
                raise WireError(f"{where}.Pods: must be an array")
            uids = []
            for i, p in enumerate(pods):
                meta = _object(p, f"{where}.Pods[{i}]").get("metadata")
                uid = meta.get("uid") if isinstance(meta, Mapping) else None
                if not isinstance(uid, str):
                    raise WireError(f"{where}.Pods[{i}].metadata.uid: required string")
                uids.append(uid)
            victims[node] = (uids, _violations(field(entry, "NumPDBViolations"), where))
    return PreemptionArgs(pod, victims)


def preemption_result(victims: dict[str, tuple[list[str], int]]) -> dict[str, Any]:
    """``ExtenderPreemptionResult``: always ``NodeNameToMetaVictims`` (UIDs), as upstream expects."""
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": pdb}
            for node, (uids, pdb) in victims.items()
        }
    }


def scheduler_name(pod: Mapping[str, Any]) -> str:
    """The v1.Pod's ``spec.schedulerName`` (the profile deciding it); empty where absent."""
    spec = pod.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else ""


def pod_identity(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    """(namespace, name, uid) of a v1.Pod document; empty strings where absent."""
    meta = pod.get("metadata") or {}

    def text(key: str) -> str:
        value = meta.get(key)
        return value if isinstance(value, str) else ""  # the parsers reject other types

    return (text("namespace"), text("name"), text("uid"))
