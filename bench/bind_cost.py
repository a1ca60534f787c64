"""CPU per binding of the extender's binder (extender/kube.py, ``Binder``) against a real API.

A real etcd and kube-apiserver on loopback (the e2e harness, tests/e2e/cluster.py), one Node
object and N pods; the binder binds them one by one, in this process, and the process CPU
(``time.process_time``), kube-apiserver's and etcd's CPU (/proc) and the wall time per binding
are printed. ``--as admin`` binds with the harness's admin client certificate (system:masters);
``--as service-account`` as deploy/ runs the extender: its ServiceAccount's bearer token, with
deploy/extender/rbac.yaml's ClusterRole (API Priority and Fairness's ``service-accounts`` flow
schema then applies). Not a timed test: run by hand, alternating checkouts for an A/B
(``PYTHONPATH=<checkout>``), and record the figures in docs/benchmarks.md.

    JOULESCHED_K8S_BIN_DIR=~/.cache/joulesched/k8s/v1.37.2/bin PYTHONPATH=. python bench/bind_cost.py [--as service-account]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))

from cluster import ControlPlane  # noqa: E402
from sched_throughput import cpu_seconds, extender_identity  # noqa: E402

from joulesched.extender.kube import Binder, preload  # noqa: E402
from joulesched.extender.wire import BindingArgs  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binds", type=int, default=300)
    p.add_argument("--as", dest="identity", choices=("admin", "service-account"), default="admin", help="whose credentials bind")
    args = p.parse_args()
    bin_dir = os.environ.get("JOULESCHED_K8S_BIN_DIR")
    if not bin_dir:
        p.error("set JOULESCHED_K8S_BIN_DIR to the directory holding kube-apiserver")
    preload()
    cp = ControlPlane(Path(bin_dir), Path(tempfile.mkdtemp(prefix="joulesched-bind-cost-")))
    cp.start()
    try:
        ns = cp.create_namespace("bind-cost")
        cp.create_node("n1", cpu="64", memory="256Gi", pods=max(110, args.binds + 10), labels={})
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: cp.create_pod(f"p{i}", ns, scheduler_name="none", cpu="10m", memory="1Mi"), range(args.binds)))
        uids = {pod.metadata.name: pod.metadata.uid for pod in cp.core.list_namespaced_pod(ns).items}
        assert cp.workdir is not None
        binder = Binder(str(extender_identity(cp, cp.workdir, args.identity).kubeconfig))
        binder(BindingArgs("p0", ns, uids["p0"], "n1"))  # the client made, the connection opened
        time.sleep(2)  # the pods' creation settled in kube-apiserver and etcd
        c0, w0 = time.process_time(), time.monotonic()
        a0, e0 = cpu_seconds(cp.apiserver.pid), cpu_seconds(cp.etcd.pid)
        for i in range(1, args.binds):
            binder(BindingArgs(f"p{i}", ns, uids[f"p{i}"], "n1"))
        c1, w1 = time.process_time(), time.monotonic()
        a1, e1 = cpu_seconds(cp.apiserver.pid), cpu_seconds(cp.etcd.pid)
        n = args.binds - 1
        bound = sum(1 for pod in cp.core.list_namespaced_pod(ns).items if pod.spec.node_name == "n1")
        print(
            f"{n} bindings as {args.identity} ({bound} pods bound): {1000 * (c1 - c0) / n:.2f} ms CPU and {1000 * (w1 - w0) / n:.2f} ms "
            f"wall a binding; kube-apiserver {1000 * (a1 - a0) / n:.2f} ms, etcd {1000 * (e1 - e0) / n:.2f} ms of CPU a binding"
        )
    finally:
        cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
