"""CPU per pod of the extender's pod watch (extender/kube.py, ``PodBindingWatch``) against a real API.

A real etcd and kube-apiserver on loopback (the e2e harness, tests/e2e/cluster.py), one Node
object; the watch runs in this process while N pods are created, bound (by a binder in a
child process, so that its CPU is not counted) and deleted. For each phase the watch
thread's own CPU (its POSIX thread CPU clock) is printed per pod, once the watch has seen the
phase through. Then the same pod's watch event, sent N times by a loopback HTTP server one
chunk every 0.3 ms, is read by ``watch_events``'s reader and by ``kubernetes.watch``'s (the
line splitter and decoder the extender used before), in the same run: the reading alone,
against the same bytes. Not a timed test: run by hand, alternating checkouts for an A/B, and record
the figures in docs/benchmarks.md.

    JOULESCHED_K8S_BIN_DIR=~/.cache/joulesched/k8s/v1.37.2/bin PYTHONPATH=. python bench/watch_cost.py
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from cluster import ControlPlane  # noqa: E402

from joulesched.extender.gunicorn_conf import post_worker_init  # noqa: E402
from joulesched.extender.kube import Binder, PodBindingWatch, preload, watch_events  # noqa: E402
from joulesched.extender.predicted import Occupancy, PredictedLoad  # noqa: E402
from joulesched.extender.wire import BindingArgs  # noqa: E402


def bind_all(kubeconfig: str, ns: str, pods: list[tuple[str, str]]) -> None:
    binder = Binder(kubeconfig)
    for name, uid in pods:
        binder(BindingArgs(name, ns, uid, "n1"))


def serve_events(line: bytes, count: int) -> int:
    """A loopback server that answers one request with ``count`` chunks of ``line``; its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n" % len(line) + line + b"\r\n"
        for _ in range(count):
            conn.sendall(chunk)
            time.sleep(0.0003)
        conn.sendall(b"0\r\n\r\n")
        conn.close()
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return int(srv.getsockname()[1])


def read_cost(line: bytes, count: int, reader: str) -> float:
    """Seconds of this thread's CPU an event, reading ``count`` paced events with ``reader``."""
    import urllib3
    from kubernetes.watch import watch as kwatch

    port = serve_events(line, count)
    resp = urllib3.PoolManager().request("GET", f"http://127.0.0.1:{port}/", preload_content=False)
    seen = 0
    start = time.thread_time()
    if reader == "kubernetes.watch":
        w = kwatch.Watch()
        for text in kwatch.iter_resp_lines(resp):
            seen += w.unmarshal_event(text, "") is not None
    else:
        for _kind, _obj in watch_events(lambda **_: resp):
            seen += 1
    spent = time.thread_time() - start
    if seen != count:
        raise SystemExit(f"{reader} read {seen} events of {count}")
    return spent / count


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pods", type=int, default=1000)
    args = p.parse_args()
    bin_dir = os.environ.get("JOULESCHED_K8S_BIN_DIR")
    if not bin_dir:
        p.error("set JOULESCHED_K8S_BIN_DIR to the directory holding kube-apiserver")
    preload()
    cp = ControlPlane(Path(bin_dir), Path(tempfile.mkdtemp(prefix="joulesched-watch-cost-")))
    cp.start()
    try:
        post_worker_init(None)  # the extender worker's collector settings
        ns = cp.create_namespace("watch-cost")
        cp.create_node("n1", cpu="64", memory="256Gi", pods=max(110, args.pods + 10), labels={})
        predicted = PredictedLoad(ttl_seconds=3600, settle_seconds=3600)
        occupancy = Occupancy()
        watch = PodBindingWatch(str(cp.kubeconfig), predicted, occupancy=occupancy)
        watch.start()
        wait_for(watch.listed.is_set, "the watch to list the pods")  # what follows comes by the watch
        clock = time.pthread_getcpuclockid(watch._thread.ident)  # type: ignore[arg-type]

        def cpu() -> float:
            return time.clock_gettime(clock)

        def settle() -> None:  # the watch idle: its CPU clock stops moving
            last = cpu()
            while True:
                time.sleep(0.3)
                now = cpu()
                if now - last < 0.001:
                    return
                last = now

        phases: list[tuple[str, float]] = []
        c0 = cpu()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: cp.create_pod(f"p{i}", ns, scheduler_name="none", cpu="10m", memory="1Mi"), range(args.pods)))
        settle()
        c1 = cpu()
        phases.append(("created (pending)", c1 - c0))
        pods = [(pod.metadata.name, pod.metadata.uid) for pod in cp.core.list_namespaced_pod(ns).items]
        child = mp.get_context("spawn").Process(target=bind_all, args=(str(cp.kubeconfig), ns, pods))
        child.start()
        child.join()
        wait_for(lambda: len(predicted) >= args.pods, "the watch to see every binding")
        settle()
        c2 = cpu()
        phases.append(("bound", c2 - c1))
        # What a listing of those bound pods costs a watch that lists again (before it resumed
        # from its resourceVersion, every watch did at the API server's 300 s timeout): a
        # second watch, not started, lists them three times in this thread.
        lister = PodBindingWatch(str(cp.kubeconfig), PredictedLoad(ttl_seconds=3600, settle_seconds=3600))
        size = len(cp.core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=", _preload_content=False).data)
        listings = []
        for _ in range(3):
            t0, w0 = time.thread_time(), time.monotonic()
            lister._list()
            listings.append((time.thread_time() - t0, time.monotonic() - w0))
        sample = cp.core.read_namespaced_pod(pods[0][0], ns, _preload_content=False).data.strip()
        line = b'{"type":"MODIFIED","object":' + sample + b"}\n"
        cp.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        wait_for(lambda: len(predicted) == 0, "the watch to see every deletion")
        settle()
        c3 = cpu()
        phases.append(("deleted", c3 - c2))
        watch.stop()
        for what, seconds in phases:
            print(f"{what:<18} {1e6 * seconds / args.pods:7.1f} µs of the watch thread's CPU a pod")
        print(f"{'all':<18} {1e6 * (c3 - c0) / args.pods:7.1f} µs a pod ({args.pods} pods)")
        print(f"a listing of the {args.pods} bound pods ({size / 1e6:.2f} MB), this thread's CPU and wall time: "
              + ", ".join(f"{1e3 * c:.0f} ms / {1e3 * w:.0f} ms" for c, w in listings))
        print(f"reading one event ({len(line)} bytes, {args.pods} paced events, this thread's CPU):")
        for reader in ("kubernetes.watch", "watch_events", "kubernetes.watch", "watch_events"):
            print(f"  {reader:<17} {1e6 * read_cost(line, args.pods, reader):7.1f} µs an event")
    finally:
        cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
