"""The extender's use of the Kubernetes API: binding pods, and watching bindings.

Both use the official ``kubernetes`` client. The client is imported here only, so that an
extender that neither binds nor watches never loads it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlsplit

import orjson

from joulesched.extender.errors import ExtenderError
from joulesched.extender.predicted import Occupancy, PredictedLoad, Unbound
from joulesched.extender.wire import BindingArgs
from joulesched.policy.demand import RUNTIME_ANNOTATION, demand_from_pod
from joulesched.policy.errors import PolicyError

log = logging.getLogger(__name__)


def preload() -> None:
    """Import the kubernetes client now, in the caller's thread.

    The import takes a second or more of CPU. Done lazily in a watch thread, it would hold the
    GIL while the worker's first scheduling requests wait, and under load push them past
    kube-scheduler's httpTimeout; done at app load, the worker only accepts once it is over.
    """
    from kubernetes import client, config

    # The client loads its API and model modules at first use (kubernetes/client/__init__.py):
    # the API class the watches and the binder use is loaded now too.
    _ = client.CoreV1Api, client.ApiClient, config.new_client_from_config


def api_client(kubeconfig: str) -> Any:
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()


class Binder:
    """Creates ``pods/binding`` for the bind verb (RBAC: create on pods/binding).

    One POST of a prepared JSON body through the kubernetes client's own connection pool and
    credentials (its TLS settings, client certificate or bearer token, refreshed as the client
    refreshes it), not through the generated API method: that built and checked a request
    model per call and cost 3.35 ms of CPU per binding against the real kube-apiserver, this
    about a tenth of it (docs/benchmarks.md, "Scheduling throughput").

    The API client is made at the first bind, not at start: like the watches, an extender
    started where the API is not reachable yet serves filter and prioritize; a bind it cannot
    make goes back to kube-scheduler as an error, and kube-scheduler (``ignorable``) binds the
    pod itself.
    """

    # kube-scheduler gives up on the bind verb after its httpTimeout (deploy/: 1 s) and, being
    # ignorable, binds the pod itself to the same node: one of the two writes then gets 409.
    TIMEOUT_SECONDS = 5.0

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self._client: Any = None
        self._pool: Any = None  # the API server's urllib3 connection pool (None: through a proxy)
        self._prefix = ""  # the path the API server's URL has, if any
        self._lock = threading.Lock()

    def _api(self) -> Any:
        with self._lock:
            if self._client is None:
                client = api_client(self.kubeconfig)
                config = client.configuration
                if not getattr(config, "proxy", None):
                    self._pool = client.rest_client.pool_manager.connection_from_url(config.host)
                    self._prefix = urlsplit(config.host).path.rstrip("/")
                self._client = client
            return self._client

    def __call__(self, args: BindingArgs) -> None:
        client = self._api()
        config = client.configuration
        metadata: dict[str, str] = {"name": args.pod_name, "namespace": args.pod_namespace}
        if args.pod_uid:  # the API then refuses to bind a recreated pod of the same name
            metadata["uid"] = args.pod_uid
        body = orjson.dumps(
            {"apiVersion": "v1", "kind": "Binding", "metadata": metadata, "target": {"apiVersion": "v1", "kind": "Node", "name": args.node}}
        )
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "joulesched-extender"}
        token = config.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        path = f"/api/v1/namespaces/{quote(args.pod_namespace, safe='')}/pods/{quote(args.pod_name, safe='')}/binding"
        # No retries: a bind that fails goes back to kube-scheduler, which binds the pod itself.
        if self._pool is None:  # through a proxy: the pool manager knows how
            resp = client.rest_client.pool_manager.request(
                "POST", config.host.rstrip("/") + path, body=body, headers=headers, timeout=self.TIMEOUT_SECONDS, retries=False
            )
        else:
            # Straight to the API server's connection pool: the pool manager would parse the URL
            # and look the pool up again for every binding.
            resp = self._pool.urlopen(
                "POST", self._prefix + path, body=body, headers=headers, timeout=self.TIMEOUT_SECONDS,
                retries=False, redirect=False, assert_same_host=False,
            )
        if not 200 <= resp.status < 300:
            raise ExtenderError(f"HTTP {resp.status}: {_status_message(resp.data)}")


def _status_message(data: bytes) -> str:
    """The ``message`` of the API's Status reply, else the start of the body."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        doc = None
    message = doc.get("message") if isinstance(doc, dict) else None
    if isinstance(message, str):
        return message
    return data[:200].decode("utf-8", "replace")


# A watch's read timeout: kube-apiserver ends each watch after its ``timeoutSeconds`` (300 s
# here), so a connection silent for longer than this is dead, not idle, and is opened again.
WATCH_SECONDS = 300
WATCH_READ_TIMEOUT_SECONDS = WATCH_SECONDS + 30


class WatchExpired(ExtenderError):
    """The watch's resourceVersion is too old (410 Gone): list again, now."""


def watch_events(list_call: Callable[..., Any], **params: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """The events of one watch request, as ``(type, object)``, the object as the API's JSON.

    ``list_call`` is a generated list method (``CoreV1Api.list_node``…); its watch response is
    read here rather than through ``kubernetes.watch``, whose ``stream`` yields ``None`` for a
    line it cannot decode (the caller then failed on ``None.get`` and listed again, saying
    nothing of the line) and whose callers here set no read timeout (a connection that died
    without a FIN held the watch forever). A line that is not a JSON event raises
    ``ExtenderError`` naming it, and the caller lists again with back-off; so does an ``ERROR``
    event, with the API's message, except 410 Gone (the resourceVersion expired), which raises
    ``WatchExpired``: list again at once. The reader costs no more than the library's: 63–66 µs of CPU
    an event against 72–85 µs (docs/benchmarks.md, "The pod watch's CPU").
    The response is closed when the caller stops iterating.
    """
    resp = list_call(
        watch=True,
        timeout_seconds=WATCH_SECONDS,
        _preload_content=False,
        _request_timeout=(30, WATCH_READ_TIMEOUT_SECONDS),
        **params,
    )
    try:
        for line in _lines(resp):
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError as err:
                raise ExtenderError(f"watch: a line that is not JSON ({err}): {bytes(line[:120])!r}") from None
            if not isinstance(event, dict) or not isinstance(event.get("type"), str) or not isinstance(event.get("object"), dict):
                raise ExtenderError(f"watch: not an event (type and object): {bytes(line[:120])!r}")
            kind, obj = event["type"], event["object"]
            if kind == "ERROR":
                said = f"watch: the API answered {obj.get('code', '')} {obj.get('reason', '')}: {obj.get('message', obj)}"
                raise (WatchExpired if obj.get("code") == 410 else ExtenderError)(said)
            yield kind, obj
    finally:
        resp.close()
        resp.release_conn()


def _lines(resp: Any) -> Iterator[bytes]:
    """The response's newline-ended lines (kube-apiserver writes one event a line, a chunk each).

    A response that is not chunked (through some proxy) is read with ``read1``, which returns
    what has arrived: ``stream(n)`` would wait for n bytes, holding events back.
    """
    pending = b""
    chunks = resp.read_chunked(decode_content=True) if resp.chunked else iter(lambda: resp.read1(65536, decode_content=True), b"")
    for chunk in chunks:
        if pending:
            chunk = pending + chunk
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if end > start:
                yield chunk[start:end]
            start = end + 1
        pending = chunk[start:]
    if pending.strip():
        yield pending


class _Watch:
    """A daemon thread that lists and watches, retrying with back-off; never raises."""

    name = "watch"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.listed = threading.Event()  # the first listing is in: what follows comes by the watch
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                self._watch_once()
                backoff = 1.0
            except Exception as err:
                log.warning("%s failed, retrying in %.0f s: %s", self.name, backoff, err)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 60.0)

    def _watch_once(self) -> None:
        raise NotImplementedError


class NodeServerWatch(_Watch):
    """Keeps ``extender.node_servers`` (node name -> physical server id) from node labels.

    RBAC: list and watch nodes. The map is replaced whole on each change, never mutated, so
    readers need no lock.
    """

    name = "node-server-watch"

    def __init__(self, kubeconfig: str, label: str, extender: Any) -> None:
        super().__init__()
        self.kubeconfig = kubeconfig
        self.label = label
        self.extender = extender

    def _watch_once(self) -> None:
        from kubernetes import client

        api = client.CoreV1Api(api_client(self.kubeconfig))
        resp: Any = api.list_node(label_selector=self.label, _request_timeout=30, _preload_content=False)
        listing = orjson.loads(resp.data)
        servers = {}
        for node in listing.get("items") or []:
            meta = node.get("metadata") or {}
            server = (meta.get("labels") or {}).get(self.label)
            if meta.get("name") and server:
                servers[meta["name"]] = server
        self.extender.node_servers = servers
        self.listed.set()
        # With the label selector a node whose label is removed comes as DELETED.
        for kind, node in watch_events(
            api.list_node, label_selector=self.label, resource_version=(listing.get("metadata") or {}).get("resourceVersion")
        ):
            if self._stop.is_set():
                return
            meta = node.get("metadata") or {}
            name = meta.get("name")
            if not name:
                continue
            server = (meta.get("labels") or {}).get(self.label)
            current = dict(self.extender.node_servers)
            if kind == "DELETED" or not server:
                current.pop(name, None)
            else:
                current[name] = server
            self.extender.node_servers = current


BOUND_PODS = "spec.nodeName!="  # a field selector: pods assigned to a node


class PodBindingWatch(_Watch):
    """Watches pods cluster-wide and records every new binding as predicted load.

    Pods already bound when the watch starts are taken as measured. Deleted pods are
    forgotten. Failures are logged and retried with back-off; they never reach a request.
    """

    name = "pod-binding-watch"

    def __init__(
        self,
        kubeconfig: str,
        predicted: PredictedLoad,
        clock: Callable[[], float] = time.time,
        occupancy: Occupancy | None = None,
        unbound: Unbound | None = None,
    ) -> None:
        super().__init__()
        self.kubeconfig = kubeconfig
        self.predicted = predicted
        self.clock = clock
        self.occupancy = occupancy
        self.unbound = unbound
        self._bound: set[str] = set()

    def _watch_once(self) -> None:
        from kubernetes import client

        api = client.CoreV1Api(api_client(self.kubeconfig))
        # Raw JSON throughout: building a V1Pod per event and turning it back into a dict cost
        # milliseconds of CPU per pod, enough for the watch to fall a burst behind the
        # scheduler, and every placement it has not seen yet is load the policy cannot see.
        resp: Any = api.list_pod_for_all_namespaces(
            field_selector=BOUND_PODS, _request_timeout=30, _preload_content=False
        )
        listing = orjson.loads(resp.data)
        items = listing.get("items") or []
        self._bound = {uid for p in items if (uid := (p.get("metadata") or {}).get("uid"))}
        if self.occupancy is not None:
            held = {}
            for pod in items:
                until = holds_node_until(pod)
                if until is not None:
                    held[pod["metadata"]["uid"]] = (pod["spec"]["nodeName"], until)
            self.occupancy.replace(held)
        self.listed.set()
        # The watch has the listing's selector: the API server drops pending pods' events (their
        # creation, kube-scheduler's status patch on every failed attempt), and a pod appears
        # as ADDED once bound.
        for kind, pod in watch_events(
            api.list_pod_for_all_namespaces,
            field_selector=BOUND_PODS,
            resource_version=(listing.get("metadata") or {}).get("resourceVersion"),
        ):
            if self._stop.is_set():
                return
            self.handle(kind, pod)

    def handle(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid") or ""
        node = (pod.get("spec") or {}).get("nodeName")
        if kind == "DELETED":
            self._bound.discard(uid)
            self.predicted.forget(uid)
            if self.occupancy is not None:
                self.occupancy.forget(uid)
            return
        if self.occupancy is not None and node:
            until = holds_node_until(pod)
            if until is None:
                self.occupancy.forget(uid)
            else:
                self.occupancy.set(uid, node, until)
        if not node or uid in self._bound:
            return
        self._bound.add(uid)
        try:
            demand = demand_from_pod(pod)
        except PolicyError as err:
            log.info("pod %s/%s: %s", meta.get("namespace"), meta.get("name"), err)
        else:
            self.predicted.record(uid, node, demand.cpu_cores, float(demand.gpus), self.clock(), confirmed=True)
        if self.unbound is not None:
            # After the record: a decision waiting on this pod must find it in the ledger.
            self.unbound.bound(uid, by_bind_verb=False)  # bound by another replica or binder


def holds_node_until(pod: dict[str, Any]) -> float | None:
    """Until when a bound pod keeps its node powered (unix time; inf: no known end), or None.

    None for a pod that holds no node: a DaemonSet's (it runs on every node), or one that has
    terminated. A pod that declares its runtime holds the node until its start plus that
    runtime; any other pod for good.
    """
    meta = pod.get("metadata") or {}
    if any((ref or {}).get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or ()):
        return None
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    raw = (meta.get("annotations") or {}).get(RUNTIME_ANNOTATION)
    try:
        runtime = float(raw) if raw is not None else math.inf
    except (TypeError, ValueError):
        runtime = math.inf
    if not math.isfinite(runtime) or runtime < 0:
        return math.inf
    started = _timestamp(status.get("startTime")) or _timestamp(meta.get("creationTimestamp"))
    return math.inf if started is None else started + runtime


def _timestamp(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None
