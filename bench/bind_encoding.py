"""kube-apiserver's and etcd's CPU per binding: a Binding sent in JSON against one in protobuf.

A real etcd and kube-apiserver on loopback (the e2e harness, tests/e2e/cluster.py), one Node
and, for each round, N pods bound over kept-alive HTTP/1.1 TLS connections, 8 in flight (as
the bind verb's threads send them during a burst), with the body in JSON (as the extender's
binder sends it) or in the API's protobuf encoding (as kube-scheduler's client does:
``clientConnection.contentType`` is protobuf by default). Rounds alternate JSON and protobuf;
kube-apiserver's and etcd's CPU (/proc) over each round is printed per binding. Not a timed
test: run by hand and record the figures in docs/benchmarks.md.

    JOULESCHED_K8S_BIN_DIR=~/.cache/joulesched/k8s/v1.37.2/bin python bench/bind_encoding.py --binds 800 --rounds 4
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))

from cluster import ControlPlane  # noqa: E402
from sched_throughput import cpu_seconds  # noqa: E402

PROTOBUF = "application/vnd.kubernetes.protobuf"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def binding_protobuf(ns: str, name: str, uid: str, node: str) -> bytes:
    """``k8s\\0`` + runtime.Unknown {typeMeta {apiVersion 1, kind 2}, raw 2}; raw: v1.Binding
    {metadata 1: ObjectMeta {name 1, namespace 3, uid 5}, target 2: ObjectReference {kind 1,
    name 3, apiVersion 5}}."""
    meta = _field(1, name) + _field(3, ns) + _field(5, uid)
    target = _field(1, "Node") + _field(3, node) + _field(5, "v1")
    return b"k8s\x00" + _field(1, _field(1, "v1") + _field(2, "Binding")) + _field(2, _field(1, meta) + _field(2, target))


def binding_json(ns: str, name: str, uid: str, node: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": ns, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
    ).encode()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binds", type=int, default=800, help="bindings a round")
    p.add_argument("--rounds", type=int, default=4, help="rounds of each encoding, alternated")
    args = p.parse_args()
    bin_dir = os.environ.get("JOULESCHED_K8S_BIN_DIR")
    if not bin_dir:
        p.error("set JOULESCHED_K8S_BIN_DIR to the directory holding kube-apiserver")
    cp = ControlPlane(Path(bin_dir), Path(tempfile.mkdtemp(prefix="joulesched-bind-encoding-")))
    cp.start()
    local = threading.local()
    crt, key = cp._admin_cert
    ctx = ssl.create_default_context(cafile=str(cp.pki.ca_crt))
    ctx.load_cert_chain(str(crt), str(key))
    port = int(cp.server.rsplit(":", 1)[1])

    def post(path: str, body: bytes, content_type: str) -> int:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx)
        conn.request("POST", path, body, {"Content-Type": content_type, "Accept": "application/json"})
        reply = conn.getresponse()
        reply.read()
        return reply.status

    try:
        cp.create_node("n1", cpu="640", memory="2560Gi", pods=100000, labels={})
        for rnd, encoding in enumerate(["json", "protobuf"] * args.rounds):
            ns = cp.create_namespace(f"r{rnd}")
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i, ns=ns: cp.create_pod(f"p{i}", ns, scheduler_name="none", cpu="1m", memory="1Mi"), range(args.binds)))
            uids = {pod.metadata.name: pod.metadata.uid for pod in cp.core.list_namespaced_pod(ns).items}
            time.sleep(2)  # the pods' creation settled

            def bind(i: int, ns: str = ns, uids: dict[str, str] = uids, encoding: str = encoding) -> int:
                name = f"p{i}"
                path = f"/api/v1/namespaces/{ns}/pods/{name}/binding"
                if encoding == "json":
                    return post(path, binding_json(ns, name, uids[name], "n1"), "application/json")
                return post(path, binding_protobuf(ns, name, uids[name], "n1"), PROTOBUF)

            a0, e0, w0 = cpu_seconds(cp.apiserver.pid), cpu_seconds(cp.etcd.pid), time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                statuses = list(pool.map(bind, range(args.binds)))
            a1, e1, w1 = cpu_seconds(cp.apiserver.pid), cpu_seconds(cp.etcd.pid), time.monotonic()
            n = args.binds
            bound = sum(1 for pod in cp.core.list_namespaced_pod(ns).items if pod.spec.node_name == "n1")
            print(
                f"{encoding:8s} {n} bindings, {statuses.count(201)} answered 201, {bound} pods bound: kube-apiserver "
                f"{1000 * (a1 - a0) / n:.3f} ms, etcd {1000 * (e1 - e0) / n:.3f} ms of CPU a binding, "
                f"{1000 * (w1 - w0) / n:.2f} ms wall",
                flush=True,
            )
    finally:
        cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
