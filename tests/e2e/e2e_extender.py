"""Helpers for the e2e tests that run joulesched's extender against the real kube-scheduler.

* :class:`ExtenderProcess` runs ``python -m joulesched extender --config CFG --listen
  127.0.0.1:PORT`` (gunicorn, as deployed) as a :class:`processes.ManagedProcess`: own
  session, log file, stopped by PID, killed if pytest dies. Its config points
  ``profiles.file.path`` at a profile document written for the test's nodes.
* :func:`deploy_extender_entry` / :func:`energy_scheduler_config` build a scheduler config
  whose extender entry is the one in ``deploy/scheduler/scheduler-config.yaml`` (weight,
  httpTimeout, nodeCacheCapable, ignorable, verbs), with only ``urlPrefix`` replaced, so the
  tests follow the manifest.
* :class:`FaultProxy` is a stdlib HTTP server that kube-scheduler talks to instead of the
  extender: it forwards to the real extender, or per verb delays, answers HTTP 500, or
  answers garbage. It records every request (verb, time).
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from binaries import REPO_ROOT
from processes import ClusterError, ManagedProcess, _wait_until

from joulesched.contracts.net import free_port

DEPLOY = REPO_ROOT / "deploy"
DEPLOY_SCHEDULER_CONFIG = DEPLOY / "scheduler" / "scheduler-config.yaml"
DEPLOY_EXTENDER_CONFIG = DEPLOY / "extender" / "config.yaml"

# SPECpower-style curves (watts at 0, 10, ..., 100 % CPU), docs/policy.md's worked example:
# a 64-core EPYC 7763 server and a 2x Xeon 8380 (80 cores) one.
EFFICIENT_CURVE = [56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268]
INEFFICIENT_CURVE = [127, 198, 226, 253, 281, 314, 354, 405, 464, 576, 619]

RUNTIME_ANNOTATION = "joulesched.io/expected-runtime-seconds"


# --------------------------------------------------------------------------
# scheduler configuration that follows deploy/
# --------------------------------------------------------------------------

def deploy_scheduler_config() -> dict:
    return yaml.safe_load(DEPLOY_SCHEDULER_CONFIG.read_text())


def deploy_extender_entry(url_prefix: str, **overrides: Any) -> dict:
    """deploy/'s extender entry with ``urlPrefix`` replaced (and ``overrides`` applied)."""
    extenders = deploy_scheduler_config().get("extenders") or []
    if len(extenders) != 1:
        raise AssertionError(f"{DEPLOY_SCHEDULER_CONFIG}: expected one extender, got {len(extenders)}")
    entry = copy.deepcopy(extenders[0])
    entry["urlPrefix"] = url_prefix
    entry.update(overrides)
    return entry


def deploy_scheduler_for(name: str, url_prefix: str) -> dict:
    """deploy/'s scheduler configuration as a test's scheduler runs it: its one profile named
    ``name``, its extender entry pointing at ``url_prefix``; no leader election (the harness
    passes the config through ``scheduler_factory``, which adds what it needs)."""
    config = deploy_scheduler_config()
    for key in ("leaderElection", "apiVersion", "kind"):
        config.pop(key, None)
    (profile,) = config["profiles"]
    profile["schedulerName"] = name
    config["extenders"] = [deploy_extender_entry(url_prefix)]
    return config


def deploy_extender_config(kubeconfig, **overrides):
    """deploy/extender/config.yaml with the profile source replaced by the test's file
    (ExtenderProcess fills in the path), the Kubernetes API reached through ``kubeconfig``
    (the manifest runs in-cluster) and ``overrides`` applied per top-level key."""
    doc = yaml.safe_load(DEPLOY_EXTENDER_CONFIG.read_text())
    doc.pop("profiles", None)
    doc.pop("listen", None)  # --listen
    doc["kubeconfig"] = str(kubeconfig)
    for key, value in overrides.items():
        doc[key] = copy.deepcopy(value)
    return doc


def energy_scheduler_config(scheduler_name: str, url_prefix: str, **overrides: Any) -> dict:
    """A scheduler config with one profile ``scheduler_name`` and deploy/'s extender entry."""
    return {"profiles": [{"schedulerName": scheduler_name}],
            "extenders": [deploy_extender_entry(url_prefix, **overrides)]}


# --------------------------------------------------------------------------
# the extender as a subprocess
# --------------------------------------------------------------------------

def node_profile(name: str, curve: list[float], cores: float, **fields: Any) -> dict:
    return {"name": name, "cores": cores, "power_curve_watts": list(curve), **fields}


class ExtenderProcess(ManagedProcess):
    """``python -m joulesched extender`` on 127.0.0.1:``port`` (gunicorn, the config's workers).

    ``profiles`` is the profile document (policy/profile.py) written to
    ``<workdir>/nodes.yaml``; ``config`` is merged over ``{"profiles": {"file": {"path":
    nodes.yaml}}}`` and written to ``<workdir>/extender.yaml``.
    """

    def __init__(self, workdir: Path, profiles: Mapping[str, Any],
                 config: Mapping[str, Any] | None = None, *, port: int | None = None,
                 name: str = "extender", wait: bool = True, timeout: float = 30,
                 tls: ssl.SSLContext | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.profiles_path = self.workdir / "nodes.yaml"
        self.profiles_path.write_text(yaml.safe_dump(dict(profiles), sort_keys=False))
        doc: dict[str, Any] = {"profiles": {"source": "file",
                                            "file": {"path": str(self.profiles_path)}}}
        for key, value in (config or {}).items():
            doc[key] = copy.deepcopy(value)
        self.config = doc
        self.config_path = self.workdir / "extender.yaml"
        self.config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        metrics_dir = self.workdir / "prometheus-multiproc"
        metrics_dir.mkdir(exist_ok=True)
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
               "PYTHONUNBUFFERED": "1"}
        argv = [sys.executable, "-m", "joulesched", "extender", "--config", self.config_path,
                "--listen", f"127.0.0.1:{self.port}"]
        super().__init__(f"joulesched-extender[{name}:{self.port}]", argv,
                         self.workdir / f"{name}.log", env=env, cwd=REPO_ROOT)
        self.tls = tls  # the test's client side of server.tls (probes: no client certificate)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}/scheduler"
        if wait:
            try:
                self.wait_ready(timeout)
            except BaseException:
                self.stop()
                raise

    # -- HTTP ---------------------------------------------------------------------------

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.tls is not None:
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=self.tls)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def _get(self, path: str) -> tuple[int, str]:
        conn = self._connection(5)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read().decode(errors="replace")
        finally:
            conn.close()

    def wait_ready(self, timeout: float = 30) -> None:
        def ready() -> bool:
            try:
                return self._get("/readyz")[0] == 200
            except OSError:
                return False
        _wait_until(ready, timeout, what=f"{self.name} /readyz", proc=self, interval=0.1)

    def post(self, verb: str, body: Any) -> tuple[int, Any]:
        conn = self._connection(10)
        try:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            conn.request("POST", f"/scheduler/{verb}", data, {"Content-Type": "application/json"})
            r = conn.getresponse()
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
        finally:
            conn.close()

    # -- metrics ------------------------------------------------------------------------

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        from prometheus_client.parser import text_string_to_metric_families
        status, text = self._get("/metrics")
        if status != 200:
            raise ClusterError(f"{self.name} /metrics: HTTP {status}: {text[:500]}")
        return [(s.name, dict(s.labels), float(s.value))
                for fam in text_string_to_metric_families(text) for s in fam.samples]

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples called ``name`` whose labels include ``labels`` (0 if none)."""
        return sum(v for n, lab, v in self.samples()
                   if n == name and all(lab.get(k) == str(x) for k, x in labels.items()))

    def requests(self, verb: str | None = None, code: str | None = None) -> float:
        labels = {k: v for k, v in (("verb", verb), ("code", code)) if v is not None}
        return self.metric("joulesched_extender_requests_total", **labels)

    def failures(self, verb: str | None = None, reason: str | None = None) -> float:
        labels = {k: v for k, v in (("verb", verb), ("reason", reason)) if v is not None}
        return self.metric("joulesched_extender_failures_total", **labels)


# --------------------------------------------------------------------------
# a misbehaving extender in front of the real one
# --------------------------------------------------------------------------

PASS = "pass"


class FaultProxy:
    """An HTTP extender endpoint at ``self.url`` that kube-scheduler is pointed at.

    Per verb (``"*"`` is the default) a mode:

    * ``"pass"``: forward to ``target`` (the real extender) and relay its answer;
    * ``("delay", seconds)``: wait, then forward (a slow extender);
    * ``("status", code)``: answer ``code`` with a JSON ``{"Error": ...}`` body;
    * ``"garbage"``: answer 200 with a body that is not JSON.

    Every request is recorded as ``(verb, monotonic time)`` in ``self.calls``.
    """

    def __init__(self, target: str | None = None, modes: Mapping[str, Any] | None = None):
        self.target = target  # "http://127.0.0.1:PORT/scheduler"
        self.modes: dict[str, Any] = {"*": PASS, **dict(modes or {})}
        self.calls: list[tuple[str, float]] = []
        self._closing = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like the real extender

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                verb = self.path.rsplit("/", 1)[-1]
                proxy.calls.append((verb, time.monotonic()))
                mode = proxy.modes.get(verb, proxy.modes["*"])
                try:
                    if isinstance(mode, tuple) and mode[0] == "delay":
                        if proxy._closing.wait(mode[1]):
                            return
                        status, out = proxy._forward(verb, body)
                    elif isinstance(mode, tuple) and mode[0] == "status":
                        status, out = mode[1], json.dumps({"Error": "injected fault"}).encode()
                    elif mode == "garbage":
                        status, out = 200, b"<html>this is not an extender</html>"
                    else:
                        status, out = proxy._forward(verb, body)
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # kube-scheduler gave up (httpTimeout) and closed the connection

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/scheduler"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        name=f"fault-proxy-{self.port}")
        self._thread.start()

    def _forward(self, verb: str, body: bytes) -> tuple[int, bytes]:
        if not self.target:
            return 502, json.dumps({"Error": "fault proxy has no target"}).encode()
        host_port = self.target.split("//", 1)[1].split("/", 1)[0]
        prefix = "/" + self.target.split("//", 1)[1].split("/", 1)[1]
        host, port = host_port.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request("POST", f"{prefix}/{verb}", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def set(self, verb: str = "*", mode: Any = PASS) -> None:
        self.modes[verb] = mode

    def count(self, verb: str) -> int:
        return sum(1 for v, _ in self.calls if v == verb)

    def close(self) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()


class HoldingRelay:
    """A TCP relay on 127.0.0.1 to ``target`` (``https://host:port``, e.g. kube-apiserver) that
    can hold what its clients send: while held, bytes from a client wait in the relay
    (answers still flow back). It can also be cut: every connection through it closed, and
    each new one closed at once, until restored. TLS passes through untouched; ``server`` is
    the URL to use."""

    def __init__(self, target: str):
        host, port = target.split("//", 1)[1].rstrip("/").rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.server = f"https://127.0.0.1:{self.listener.getsockname()[1]}"
        self.passing = threading.Event()
        self.passing.set()
        self.open = threading.Event()
        self.open.set()
        self._sockets: list[socket.socket] = [self.listener]
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="holding-relay").start()

    def hold(self) -> None:
        self.passing.clear()

    def release(self) -> None:
        self.passing.set()

    def cut(self) -> None:
        with self._lock:
            self.open.clear()
            connections, self._sockets[1:] = self._sockets[1:], []
        for s in connections:
            _shut(s)

    def restore(self) -> None:
        self.open.set()

    def kubeconfig(self, kubeconfig: Path, out: Path) -> Path:
        """``kubeconfig`` with every cluster's server pointed at the relay, written to ``out``."""
        doc = yaml.safe_load(Path(kubeconfig).read_text())
        for cluster in doc["clusters"]:
            cluster["cluster"]["server"] = self.server
        out.write_text(yaml.safe_dump(doc))
        return out

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed or not self.open.is_set():
                    client.close()
                    if self._closed:
                        return
                    continue
                try:
                    upstream = socket.create_connection(self.target)
                except OSError:
                    client.close()
                    continue
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, holdable: bool) -> None:
        try:
            while data := src.recv(65536):
                if holdable:
                    self.passing.wait()
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self.passing.set()
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            _shut(s)  # for the listener, this wakes the thread blocked in accept; close alone does not


def _shut(s: socket.socket) -> None:
    """Shut ``s`` down and close it: the shutdown wakes a thread blocked in recv or accept on it,
    which close alone does not on Linux."""
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # its peer had gone already
    s.close()


# --------------------------------------------------------------------------
# pods
# --------------------------------------------------------------------------

def placements(cp: Any, namespace: str, names: Iterable[str] | None = None) -> dict[str, str | None]:
    """pod name -> spec.nodeName (None while pending) for the namespace's pods."""
    pods = cp.core.list_namespaced_pod(namespace).items
    wanted = set(names) if names is not None else None
    return {p.metadata.name: p.spec.node_name for p in pods
            if wanted is None or p.metadata.name in wanted}


def wait_all_bound(cp: Any, namespace: str, names: Iterable[str], timeout: float = 60
                   ) -> dict[str, str]:
    names = list(names)

    def done() -> dict[str, str] | None:
        placed = placements(cp, namespace, names)
        if len(placed) == len(names) and all(placed.values()):
            return placed  # type: ignore[return-value]
        return None

    try:
        return _wait_until(done, timeout, interval=0.25,
                           what=f"{len(names)} pods in {namespace} to be bound")
    except ClusterError as err:
        placed = placements(cp, namespace, names)
        pending = sorted(n for n in names if not placed.get(n))
        raise ClusterError(f"{err}; {len(pending)} still pending, e.g. {pending[:5]}") from None


def stays_pending(cp: Any, namespace: str, name: str, seconds: float) -> bool:
    """True if the pod is still unbound after ``seconds`` (checked throughout)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cp.pod_node(name, namespace):
            return False
        time.sleep(0.2)
    return not cp.pod_node(name, namespace)
