"""The joulesched extender as the simulated kube-scheduler calls it: in-process, or over HTTP.

Both paths answer the same two questions for a pod and its candidate nodes — which pass the
filter, and the 0..10 score of each — from the same inputs:

* :class:`InProcessExtender` calls ``policy.scoring.evaluate`` on a ``NodeArrays`` view of the
  cluster whose utilisation, GPU utilisation and carbon intensity are the live values;
* :class:`HttpExtender` writes the same values as a profile document (``policy/profile.py``)
  to the file a running extender's ``file`` source reads, then POSTs the real wire protocol
  (kube-scheduler extender v1) to ``{url}/filter`` and ``{url}/prioritize`` over one kept-alive
  connection.

The document carries no ``updated`` time (a static profile is always fresh) and the extender
must run with ``predicted_load.ttl_seconds: 0`` and ``profiles.file.reload_seconds`` close to
0 (:func:`extender_config` writes such a config): then its view at every call is the
simulator's, and both paths place every pod identically (tests/sim/test_extender_http.py).
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import numpy as np
import orjson
import yaml

from joulesched.contracts.net import free_port
from joulesched.policy.config import PolicyConfig
from joulesched.policy.demand import GPU_RESOURCE, PodDemand
from joulesched.policy.profile import NodeArrays, parse_profiles
from joulesched.policy.scoring import evaluate
from joulesched.policy.validate import settings_document
from joulesched.sim.errors import ExtenderCallError

_DNS_LABEL = re.compile(r"[^a-z0-9.-]+")


@dataclass(frozen=True)
class ClusterView:
    """What the policy sees at one moment: one row per node, in the engine's node order."""

    names: Sequence[str]
    utilisation: np.ndarray  # 0..1 measured CPU utilisation
    gpu_utilisation: np.ndarray  # 0..1
    carbon_intensity: Mapping[str, float]  # per site, now
    version: int  # increases whenever any of the above changes
    document: Any  # callable returning the profile document for this view
    held: np.ndarray | None = None  # bool per node: it runs pods (None: every node counts as held)


@dataclass(frozen=True)
class PodRequest:
    """One pod as the extender sees it."""

    index: int
    name: str
    namespace: str
    cpu_milli: int  # request, millicores (0: none)
    memory_bytes: int
    gpus: int


class Extender(Protocol):
    name: str
    calls: int

    def decide(
        self, pod: PodRequest, candidates: np.ndarray, view: ClusterView, now: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """(passed mask, 0..10 scores) for ``candidates`` (node indices)."""
        ...

    def close(self) -> None: ...


def demand_of(pod: PodRequest) -> PodDemand:
    """The demand ``policy.demand.demand_from_pod`` reads from :func:`pod_json` of this pod."""
    if pod.cpu_milli == 0:
        return PodDemand(0.1, float(pod.memory_bytes), pod.gpus, None, "default")
    return PodDemand(pod.cpu_milli / 1000.0, float(pod.memory_bytes), pod.gpus, None, "requests")


def k8s_name(name: str, index: int) -> str:
    """A DNS-1123 name for a simulated pod (unique through its index)."""
    base = _DNS_LABEL.sub("-", name.lower()).strip("-.")[:50] or "pod"
    return f"{base}-{index}"


def pod_json(pod: PodRequest) -> dict[str, Any]:
    """The pod as a ``v1.Pod`` document, as kube-scheduler sends it to an extender."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if pod.cpu_milli:
        requests["cpu"] = f"{pod.cpu_milli}m"
    if pod.memory_bytes:
        requests["memory"] = str(pod.memory_bytes)
    if pod.gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(pod.gpus)
    resources: dict[str, Any] = {"requests": requests}
    if limits:
        resources["limits"] = limits
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": k8s_name(pod.name, pod.index), "namespace": pod.namespace, "uid": f"sim-{pod.index}"},
        "spec": {
            "schedulerName": "joulesched",
            "containers": [{"name": "main", "image": "joulesched.io/sim", "resources": resources}],
        },
    }


class InProcessExtender:
    """``policy.scoring.evaluate`` over every candidate at once (numpy)."""

    def __init__(self, name: str, document: Mapping[str, Any], policy: PolicyConfig) -> None:
        self.name = name
        self.policy = policy
        self.calls = 0
        profiles = parse_profiles(document, f"simulated cluster for {name}")
        self.base = NodeArrays.build(profiles.nodes)
        self.site_names = sorted({p.site for p in profiles.nodes})
        self.site_index = np.array([self.site_names.index(p.site) for p in profiles.nodes], dtype=np.intp)
        self._arrays = self.base
        self._version = -1
        self._carbon_key: tuple[float, ...] = ()
        self._carbon = np.zeros(len(profiles.nodes))

    def _arrays_for(self, view: ClusterView) -> NodeArrays:
        if view.version != self._version:
            key = tuple(view.carbon_intensity.get(s, 0.0) for s in self.site_names)
            if key != self._carbon_key:  # changes once an hour at most
                self._carbon = np.asarray(key, dtype=float)[self.site_index]
                self._carbon_key = key
            ci = self._carbon
            held_until = np.nan if view.held is None else np.where(view.held, np.nan, 0.0)
            self._arrays = self.base.with_columns(
                utilisation=view.utilisation,
                gpu_utilisation=view.gpu_utilisation,
                carbon_intensity=ci,
                held_until=held_until,
            )
            self._version = view.version
        return self._arrays

    def decide(
        self, pod: PodRequest, candidates: np.ndarray, view: ClusterView, now: float
    ) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        ev = evaluate(self._arrays_for(view), candidates, demand_of(pod), self.policy, now)
        return ev.kept(self.policy), ev.scores

    def close(self) -> None:
        return None


class HttpExtender:
    """A running extender, called with the real wire protocol over one kept-alive connection."""

    def __init__(
        self, name: str, url: str, profile_path: str | Path, *, timeout: float = 30.0, use_filter: bool = True
    ) -> None:
        self.name = name
        self.url = url.rstrip("/")
        parts = urlsplit(self.url)
        if parts.scheme != "http" or not parts.hostname:
            raise ExtenderCallError(f"--extender-url {url!r}: must be an http://HOST:PORT/PREFIX URL")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.profile_path = Path(profile_path)
        self.timeout = timeout
        self.use_filter = use_filter
        self.calls = 0
        self._conn: http.client.HTTPConnection | None = None
        self._written = -1
        self._mtime_ns = 0

    def write_profiles(self, view: ClusterView) -> None:
        """Write the view as a profile document, atomically, with a new modification time."""
        if view.version == self._written and self.profile_path.exists():
            return
        data = orjson.dumps(view.document())
        tmp = self.profile_path.with_name(f".{self.profile_path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.profile_path)
        # File times are as coarse as the kernel tick: two writes in one tick would look
        # unchanged to the extender's mtime check, so set a strictly increasing time.
        self._mtime_ns = max(self._mtime_ns + 1_000, time.time_ns())
        os.utime(self.profile_path, ns=(self._mtime_ns, self._mtime_ns))
        self._written = view.version

    def _post(self, verb: str, body: bytes) -> Any:
        path = f"{self.prefix}/{verb}"
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self._conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                response = self._conn.getresponse()
                payload = response.read()
            except (OSError, http.client.HTTPException) as err:
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise ExtenderCallError(f"POST {self.url}/{verb}: {err} — is the extender running?") from err
                continue
            if response.status != 200:
                raise ExtenderCallError(
                    f"POST {self.url}/{verb}: HTTP {response.status}: {payload[:300].decode(errors='replace')}"
                )
            try:
                return orjson.loads(payload)
            except orjson.JSONDecodeError as err:
                raise ExtenderCallError(f"POST {self.url}/{verb}: answer is not JSON: {payload[:200]!r}") from err
        raise AssertionError("unreachable")  # pragma: no cover

    def decide(
        self, pod: PodRequest, candidates: np.ndarray, view: ClusterView, now: float
    ) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        self.write_profiles(view)
        names = [view.names[i] for i in candidates]
        doc = pod_json(pod)
        passed = np.ones(len(names), dtype=bool)
        if self.use_filter:
            result = self._post("filter", orjson.dumps({"Pod": doc, "NodeNames": names}))
            if not isinstance(result, dict):
                raise ExtenderCallError(
                    f"POST {self.url}/filter: expected an ExtenderFilterResult object, got {result!r:.200}"
                )
            if result.get("Error"):
                raise ExtenderCallError(f"POST {self.url}/filter: extender error: {result['Error']}")
            kept = set(result.get("NodeNames") or [])
            passed = np.fromiter((n in kept for n in names), dtype=bool, count=len(names))
        scores = np.zeros(len(names), dtype=np.int64)
        keep = [n for n, ok in zip(names, passed, strict=True) if ok]
        if len(keep) > 1:
            answer = self._post("prioritize", orjson.dumps({"Pod": doc, "NodeNames": keep}))
            if not isinstance(answer, list):
                raise ExtenderCallError(
                    f"POST {self.url}/prioritize: expected a HostPriorityList array, got {answer!r:.200}"
                )
            by_host = {}
            for item in answer:
                if not isinstance(item, dict) or "Host" not in item or "Score" not in item:
                    raise ExtenderCallError(f"POST {self.url}/prioritize: bad HostPriority {item!r:.200}")
                by_host[item["Host"]] = int(item["Score"])
            scores = np.fromiter((by_host.get(n, 0) for n in names), dtype=np.int64, count=len(names))
        return passed, scores

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def extender_config(profile_path: str | Path, policy: PolicyConfig, listen: str) -> dict[str, Any]:
    """An extender config whose view is exactly the document the simulator writes."""
    return {
        "listen": listen,
        "prefix": "/scheduler",
        # absolute: the extender reads a relative path against its config file's folder
        "profiles": {"source": "file", "file": {"path": str(Path(profile_path).resolve()), "reload_seconds": 1e-6}},
        "policy": settings_document(policy),  # every setting, as the simulator's own policy has it
        "predicted_load": {"ttl_seconds": 0},
        "server": {"workers": 1, "threads": 2},
    }


class SpawnedExtender:
    """``python -m joulesched extender`` on a loopback port, for one policy; stopped by PID."""

    def __init__(self, policy: PolicyConfig, document: Mapping[str, Any], workdir: str | Path | None = None) -> None:
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="joulesched-sim-ext-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.profile_path = self.dir / f"profiles-{policy.strategy}.json"
        self.profile_path.write_bytes(orjson.dumps(document))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/scheduler"
        config_path = self.dir / f"extender-{policy.strategy}.yaml"
        config_path.write_text(
            yaml.safe_dump(extender_config(self.profile_path, policy, f"127.0.0.1:{port}")), encoding="utf-8"
        )
        self.log_path = self.dir / f"extender-{policy.strategy}.log"
        env = dict(os.environ)
        env.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="joulesched-sim-metrics-"))
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "joulesched", "extender", "--config", str(config_path)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self._wait_ready(port)

    def _wait_ready(self, port: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._log.close()
                raise ExtenderCallError(f"the extender exited with {self.process.returncode}; see {self.log_path}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
                conn.request("GET", "/readyz")
                ok = conn.getresponse().status == 200
                conn.close()
                if ok:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise ExtenderCallError(f"the extender did not become ready in {timeout:g} s; see {self.log_path}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self._log.close()
