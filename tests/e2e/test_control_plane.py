"""Smoke tests for the e2e harness: real kube-apiserver + kube-scheduler.

Also pins the scheduler-extender wire format: the request bodies that
kube-scheduler POSTs to an HTTP extender are checked key by key, and samples
are kept in tests/e2e/testdata/ (regenerate with JOULESCHED_UPDATE_GOLDEN=1).
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cluster import ControlPlane
from processes import live_pids, pid_alive

from joulesched.extender import wire

TESTDATA = Path(__file__).resolve().parent / "testdata"
# The release hack/build-k8s.sh pins, or the other minor the suite also runs on
# (JOULESCHED_K8S_VERSION with JOULESCHED_K8S_BIN_DIR, as .ci/run sets them).
PINNED_VERSION = os.environ.get("JOULESCHED_K8S_VERSION") or "v1.37.2"


# --------------------------------------------------------------------------
# control plane basics
# --------------------------------------------------------------------------

def test_control_plane_comes_up_fast(control_plane):
    # etcd + apiserver + cert generation; a few seconds on a laptop.
    assert control_plane.startup_seconds < 30, control_plane.startup_seconds
    code, body = control_plane.readyz(verbose=True)
    assert code == 200, body
    out = control_plane.kubectl("version", "-o", "json").stdout
    version = json.loads(out)
    assert version["serverVersion"]["gitVersion"] == PINNED_VERSION
    assert version["clientVersion"]["gitVersion"] == PINNED_VERSION
    # every listener is on loopback
    assert control_plane.server.startswith("https://127.0.0.1:")
    assert control_plane.etcd_url.startswith("http://127.0.0.1:")
    # admission works for pods in `default` (ServiceAccount exists)
    sa = control_plane.core.read_namespaced_service_account("default", "default")
    assert sa.metadata.name == "default"


def test_kubectl_server_dry_run_and_auth_can_i(control_plane, e2e_namespace):
    manifest = """
apiVersion: v1
kind: ConfigMap
metadata:
  name: dry
data:
  k: v
"""
    out = control_plane.kubectl("apply", "--dry-run=server", "-n", e2e_namespace,
                                "-f", "-", input=manifest).stdout
    assert "configmap/dry created (server dry run)" in out
    cms = control_plane.core.list_namespaced_config_map(e2e_namespace).items
    assert "dry" not in [c.metadata.name for c in cms]
    # RBAC is on: the admin may, an unbound ServiceAccount may not.
    assert control_plane.kubectl("auth", "can-i", "list", "nodes").stdout.strip() == "yes"
    r = control_plane.kubectl("auth", "can-i", "list", "nodes",
                              f"--as=system:serviceaccount:{e2e_namespace}:default",
                              check=False)
    assert r.stdout.strip() == "no"
    # a cert-based user from client_kubeconfig() is subject to RBAC too
    kc = control_plane.client_kubeconfig("jane", ["dev"])
    r = control_plane.kubectl("auth", "can-i", "create", "pods", "-n", e2e_namespace,
                              kubeconfig=kc, check=False)
    assert r.stdout.strip() == "no"


def test_node_is_ready_and_untainted(control_plane, node_factory):
    node_factory("smoke-node", cpu="8", memory="16Gi", gpus=2,
                 labels={"joulesched.io/test": "yes"})
    n = control_plane.core.read_node("smoke-node")
    assert not n.spec.taints, n.spec.taints
    ready = [c for c in n.status.conditions if c.type == "Ready"]
    assert ready and ready[0].status == "True"
    assert n.status.allocatable["cpu"] == "8"
    assert n.status.allocatable["memory"] == "16Gi"
    assert n.status.allocatable["nvidia.com/gpu"] == "2"
    assert n.metadata.labels["joulesched.io/test"] == "yes"


def test_default_scheduler_binds_pod(control_plane, node_factory, scheduler_factory,
                                     e2e_namespace):
    node_factory("bind-node", cpu="4", memory="8Gi")
    sched = scheduler_factory(None, name="default", verbosity=2)
    assert sched.scheduler_names == ["default-scheduler"]
    control_plane.create_pod("fits", e2e_namespace, cpu="1", memory="1Gi")
    assert control_plane.wait_for_pod_scheduled("fits", e2e_namespace) == "bind-node"

    control_plane.create_pod("too-big", e2e_namespace, cpu="64")
    ev = control_plane.wait_for_failed_scheduling("too-big", e2e_namespace)
    assert "Insufficient cpu" in ev.message, ev.message
    assert control_plane.pod_node("too-big", e2e_namespace) is None


def test_processes_are_gone_after_stop(k8s_bin_dir, tmp_path):
    cp = ControlPlane(k8s_bin_dir, tmp_path)
    with cp:
        cp.start_scheduler({"profiles": [{"schedulerName": "a"}]}, name="a")
        cp.start_scheduler({"profiles": [{"schedulerName": "b"}]}, name="b")
        pids = cp.pids()
        assert len(pids) == 4
        assert all(pid_alive(p) for p in pids)
    assert not [p for p in pids if pid_alive(p)]
    assert not set(pids) & set(live_pids())


# --------------------------------------------------------------------------
# extender wire format
# --------------------------------------------------------------------------

class RecordingExtender:
    """Stdlib HTTP scheduler extender on 127.0.0.1 that records every request.

    filter: keeps every node (echoes NodeNames, and Nodes when it was sent,
    unless ``answer_nodes=False``); prioritize: ``scores[name]`` (default 0).
    """

    def __init__(self, scores=None, answer_nodes=True):
        self.requests: list[dict] = []
        self.scores = dict(scores or {})
        self.answer_nodes = answer_nodes
        ext = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep pytest output clean
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw)
                ext.requests.append({"path": self.path,
                                     "content_type": self.headers.get("Content-Type"),
                                     "body": body, "raw": raw})
                verb = self.path.rsplit("/", 1)[-1]
                names = ext._names(body)
                if verb == "filter":
                    resp = {"NodeNames": names, "FailedNodes": {},
                            "FailedAndUnresolvableNodes": {}, "Error": ""}
                    if ext.answer_nodes and body.get("Nodes") is not None:
                        resp["Nodes"] = body["Nodes"]
                elif verb == "prioritize":
                    resp = [{"Host": n, "Score": ext.scores.get(n, 0)} for n in names]
                else:
                    self.send_error(404)
                    return
                out = json.dumps(resp).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/scheduler"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def _names(body):
        if body.get("NodeNames") is not None:
            return list(body["NodeNames"])
        return [n["metadata"]["name"] for n in (body.get("Nodes") or {}).get("items") or []]

    def bodies(self, verb):
        return [r["body"] for r in self.requests if r["path"].endswith("/" + verb)]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def extender():
    made = []

    def make(**kw):
        e = RecordingExtender(**kw)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def extender_config(scheduler_name, url, node_cache_capable):
    return {
        "profiles": [{"schedulerName": scheduler_name}],
        "extenders": [{
            "urlPrefix": url,
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "weight": 1,
            "nodeCacheCapable": node_cache_capable,
            "ignorable": False,
        }],
    }


def _golden(name, data):
    """Write a golden sample if missing or JOULESCHED_UPDATE_GOLDEN=1."""
    path = TESTDATA / name
    if os.environ.get("JOULESCHED_UPDATE_GOLDEN") == "1" or not path.exists():
        TESTDATA.mkdir(exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
    return json.loads(path.read_text())


def _skeleton(obj):
    """Top-level key -> JSON type, to compare wire shapes without values."""
    return {k: type(v).__name__ for k, v in obj.items()}


@pytest.mark.parametrize("node_cache_capable", [True, False],
                         ids=["nodeCacheCapable-true", "nodeCacheCapable-false"])
def test_extender_is_called_with_expected_wire_format(
        control_plane, node_factory, scheduler_factory, extender, node_cache_capable):
    tag = "true" if node_cache_capable else "false"
    ns = control_plane.create_namespace("e2e-wire")
    # Two identical nodes: prioritize is only called with >1 feasible node.
    node_factory(f"wire-{tag}-a", cpu="4", memory="8Gi", labels={"wire": tag})
    node_factory(f"wire-{tag}-b", cpu="4", memory="8Gi", labels={"wire": tag})
    ext = extender(scores={f"wire-{tag}-b": 10})
    sched_name = f"wire-{tag}"
    scheduler_factory(extender_config(sched_name, ext.url, node_cache_capable),
                      name=sched_name, verbosity=4)

    pod = f"wire-pod-{tag}"
    try:
        control_plane.create_pod(pod, ns, scheduler_name=sched_name, cpu="100m",
                                 memory="64Mi", node_selector={"wire": tag},
                                 labels={"app": "wire"})
        node = control_plane.wait_for_pod_scheduled(pod, ns)
    finally:
        control_plane.delete_pod(pod, ns)
    # Identical nodes: the extender's 10 (x weight 1 x 100/10) decides.
    assert node == f"wire-{tag}-b"

    filt, prio = ext.bodies("filter"), ext.bodies("prioritize")
    assert filt and prio, ext.requests
    for r in ext.requests:
        assert r["content_type"] == "application/json"
        assert r["path"] in ("/scheduler/filter", "/scheduler/prioritize")

    for body in (filt[0], prio[0]):
        # ExtenderArgs has no json tags: Go field names, all three always present.
        assert list(body) == ["Pod", "Nodes", "NodeNames"]
        assert body["Pod"]["metadata"]["name"] == pod
        assert body["Pod"]["spec"]["schedulerName"] == sched_name
        if node_cache_capable:
            assert body["Nodes"] is None
            assert sorted(body["NodeNames"]) == [f"wire-{tag}-a", f"wire-{tag}-b"]
        else:
            assert body["NodeNames"] is None
            assert set(body["Nodes"]) >= {"metadata", "items"}
            items = body["Nodes"]["items"]
            assert sorted(n["metadata"]["name"] for n in items) == \
                [f"wire-{tag}-a", f"wire-{tag}-b"]
            assert items[0]["status"]["allocatable"]["cpu"] == "4"

    if not node_cache_capable:
        # The bytes as kube-scheduler sent them are what the extender reads without decoding
        # the nodes (extender/wire.py, _scan_scheduler_nodes), to the same result.
        for r in ext.requests:
            scanned = wire._scan_scheduler_nodes(r["raw"])
            assert scanned is not None, r["raw"][:200]
            assert scanned.node_names == ext._names(r["body"])
            assert scanned.nodes.decoded() == r["body"]["Nodes"]["items"]
            assert scanned.pod == r["body"]["Pod"]

    gf = _golden(f"extender_filter_args_nodecachecapable_{tag}.json", filt[0])
    gp = _golden(f"extender_prioritize_args_nodecachecapable_{tag}.json", prio[0])
    assert _skeleton(gf) == _skeleton(filt[0])
    assert _skeleton(gp) == _skeleton(prio[0])
    assert _skeleton(gf["Pod"]) == _skeleton(filt[0]["Pod"])


def test_not_node_cache_capable_extender_must_answer_nodes(
        control_plane, node_factory, scheduler_factory, extender):
    """With nodeCacheCapable=false kube-scheduler only reads `Nodes` from the
    filter result; an answer with only `NodeNames` filters out every node."""
    ns = control_plane.create_namespace("e2e-wire")
    node_factory("names-only-a", labels={"wire": "names-only"})
    node_factory("names-only-b", labels={"wire": "names-only"})
    ext = extender(answer_nodes=False)
    scheduler_factory(extender_config("names-only", ext.url, False), name="names-only")
    try:
        control_plane.create_pod("names-only-pod", ns, scheduler_name="names-only",
                                 node_selector={"wire": "names-only"})
        ev = control_plane.wait_for_failed_scheduling("names-only-pod", ns)
    finally:
        control_plane.delete_pod("names-only-pod", ns)
    assert ext.bodies("filter")
    assert ev.message.startswith("0/"), ev.message
