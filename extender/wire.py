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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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


def nesting_error(items: list[Any], where: str) -> WireError | None:
    """The first of ``items`` that orjson cannot write back (nested past its 255 levels), named."""
    for i, item in enumerate(items):
        try:
            orjson.dumps(item)
        except orjson.JSONEncodeError as err:
            return WireError(f"{where}[{i}]: cannot be echoed back: {err}")
    return None


@dataclass(frozen=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    node_names: list[str]
    nodes: list[Mapping[str, Any]] | None  # the full v1.Node objects when sent (nodeCacheCapable: false)

    @property
    def node_cache_capable(self) -> bool:
        return self.nodes is None


def parse_extender_args(body: bytes) -> ExtenderArgs:
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
        return ExtenderArgs(pod, names, items)
    if names_value is not None:
        if not isinstance(names_value, list):
            raise WireError(f"ExtenderArgs.NodeNames: must be an array of strings, got {_kind(names_value)}")
        _check_count(len(names_value), "ExtenderArgs.NodeNames")
        if not set(map(type, names_value)) <= {str}:  # the common case in one C-level pass
            for i, name in enumerate(names_value):
                if not isinstance(name, str):
                    raise WireError(f"ExtenderArgs.NodeNames[{i}]: must be a string, got {_kind(name)}")
        return ExtenderArgs(pod, names_value, None)
    raise WireError(
        "ExtenderArgs: one of NodeNames (nodeCacheCapable: true) or Nodes (nodeCacheCapable: false) is required"
    )


def _check_count(count: int, where: str) -> None:
    if count > MAX_NODES:
        raise WireError(f"{where}: {count} nodes, more than the {MAX_NODES} a request may name")


def filter_result(
    args: ExtenderArgs, passed: list[int], failed: dict[str, str], unresolvable: dict[str, str]
) -> dict[str, Any]:
    """``ExtenderFilterResult`` for the candidates at positions ``passed``.

    ``NodeNames`` is always a list (never null: a null NodeNames filters out every node in
    nodeCacheCapable mode); in Nodes mode the passing node objects are echoed unchanged.
    """
    names = [args.node_names[i] for i in passed]
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": names,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }
    if args.nodes is not None:
        result["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": [args.nodes[i] for i in passed]}
    return result


def host_priority_list(names: list[str], scores: list[int]) -> list[dict[str, Any]]:
    """``HostPriorityList``: a bare array, one integer score per candidate, in input order."""
    return [{"Host": name, "Score": score} for name, score in zip(names, scores, strict=True)]


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


def pod_identity(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    """(namespace, name, uid) of a v1.Pod document; empty strings where absent."""
    meta = pod.get("metadata") or {}

    def text(key: str) -> str:
        value = meta.get(key)
        return value if isinstance(value, str) else ""  # the parsers reject other types

    return (text("namespace"), text("name"), text("uid"))
