"""``joulesched bench``: the extender's latency and throughput against a constant-score floor.

Both servers run on loopback and are driven the way kube-scheduler drives an extender: one
kept-alive HTTP/1.1 connection, one request at a time, for each pod (a new one each time) its
filter and then its prioritize (``--connections`` adds parallel clients for a throughput
figure). The floor is a minimal stdlib extender (ThreadingHTTPServer,
HTTP/1.1 keep-alive, TCP_NODELAY) that decodes the request with the json module and returns
a constant score for every node: the cost of Python over HTTP with no policy at all. The
figures that matter are ratios measured in the same run, on the same noisy machine: with one
client the two servers are driven in turn, ``--block-pods`` pods at a time (one by default),
the order swapped every block, so that a slow second of the machine falls on both alike
(measured one after the other, each p99 was of a different two seconds).

Pod by pod, as a burst from kube-scheduler keeps an extender busy: in blocks of 50 each
server sat idle through the other's 16–25 ms, and the first request after such a pause is
slow (why was not traced; the more a request does, the more it pays): joulesched's filter
took 0.59–0.75 ms there against its 0.26–0.29 ms, the floor's 0.31–0.43 against 0.14–0.18,
and those first requests, 2 % of them, were the p99 (docs/benchmarks.md, "The first request
after an idle spell"). ``--block-pods 50`` measures as before.

    joulesched bench [--requests N] [--workers W] [--connections C] [--block-pods B] [--out FILE]
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import multiprocessing as mp
import os
import platform
import random
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import yaml

from joulesched.contracts.cliargs import number
from joulesched.extender.demo import free_port, wait_ready

CURVES: list[list[float]] = [
    [56.8, 100, 116, 130, 143, 162, 191, 211, 231, 250, 268],
    [127, 198, 226, 253, 281, 314, 354, 405, 464, 576, 619],
    [63.8, 99.6, 113, 128, 150, 163, 173, 182, 193, 203, 224],
    [45.6, 70.3, 79.8, 88.8, 97.4, 106, 117, 129, 144, 163, 183],
]
SCENARIOS = [("names", 100), ("names", 1000), ("names", 5000), ("nodes", 100), ("nodes", 1000)]
COUNT = number(whole=True, at_least=1)


def node_name(i: int) -> str:
    return f"node-{i:05d}"


def profile_document(n: int, seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    nodes = []
    for i in range(n):
        curve = CURVES[i % len(CURVES)]
        scale = 0.9 + 0.2 * rng.random()
        nodes.append(
            {
                "name": node_name(i),
                "cores": 64,
                "power_curve_watts": [round(w * scale, 2) for w in curve],
                "utilisation": round(rng.random() * 0.8, 3),
                "speed": round(0.8 + 0.4 * rng.random(), 3),
            }
        )
    return {"nodes": nodes}


def full_node(i: int) -> dict[str, Any]:
    """A v1.Node about as large as a real one (labels, capacity, conditions, images)."""
    name = node_name(i)
    return {
        "metadata": {
            "name": name,
            "uid": f"00000000-0000-4000-8000-{i:012d}",
            "resourceVersion": str(1000 + i),
            "creationTimestamp": "2026-11-01T00:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "m6i.16xlarge",
                "topology.kubernetes.io/zone": f"zone-{i % 3}",
                "topology.kubernetes.io/region": "region-1",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {"podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24", "providerID": f"aws:///zone/i-{i:017x}"},
        "status": {
            "capacity": {"cpu": "64", "memory": "263835568Ki", "pods": "110", "ephemeral-storage": "507944172Ki"},
            "allocatable": {"cpu": "63800m", "memory": "261738416Ki", "pods": "110", "ephemeral-storage": "468118597401"},
            "conditions": [
                {"type": t, "status": "False" if t != "Ready" else "True", "lastHeartbeatTime": "2026-11-29T00:00:00Z",
                 "lastTransitionTime": "2026-11-01T00:00:00Z", "reason": f"Kubelet{t}", "message": f"kubelet reports {t}"}
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
            ],
            "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 256 % 256}.{i % 256}"}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": "v1.34.4", "containerRuntimeVersion": "containerd://2.1.4", "osImage": "Debian GNU/Linux 13",
                         "kernelVersion": "6.12.0", "architecture": "amd64", "operatingSystem": "linux"},
            "images": [{"names": [f"registry.example/app-{k}@sha256:{k:064x}", f"registry.example/app-{k}:v{k}"], "sizeBytes": 10_000_000 * (k + 1)} for k in range(8)],
        },
    }


def request_body(mode: str, n: int) -> bytes:
    """An ``ExtenderArgs`` as kube-scheduler encodes it (tests/e2e/testdata/README.md): Go field
    names, all three keys, the unused one null; the pod and NodeList without kind/apiVersion."""
    pod = {
        "metadata": {"name": "bench", "namespace": "default", "uid": "11111111-2222-4333-8444-555555555555",
                     "labels": {"app": "bench"}, "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "bench", "uid": "x"}]},
        "spec": {"schedulerName": "joulesched",
                 "containers": [{"name": "main", "image": "registry.example/app:v1", "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}]},
    }
    if mode == "names":
        return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": [node_name(i) for i in range(n)]})
    return orjson.dumps({"Pod": pod, "Nodes": {"metadata": {}, "items": [full_node(i) for i in range(n)]}, "NodeNames": None})


# -- the floor ----------------------------------------------------------------------------------


class FloorHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as kube-scheduler's client expects

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:
        args = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        names = args.get("NodeNames")
        if names is None:
            names = [n["metadata"]["name"] for n in args["Nodes"]["items"]]
        if self.path.endswith("/prioritize"):
            reply: Any = [{"Host": n, "Score": 5} for n in names]
        else:
            reply = {"Nodes": args.get("Nodes"), "NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
        body = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


def run_floor(port: int) -> None:
    http.server.ThreadingHTTPServer(("127.0.0.1", port), FloorHandler).serve_forever()


# -- the client ---------------------------------------------------------------------------------


WARMUP_SECONDS = 2.5  # past the extender's first per-node gauge ticks (one a second)
BLOCK_PODS = 1  # pods sent to one server before the other's turn (--block-pods; see the module's doc)
_HEADERS = {"Content-Type": "application/json"}


POD_UID = b"11111111-2222-4333-8444-555555555555"  # request_body's pod, renamed for each request
VERBS = ("filter", "prioritize")


def pod_body(body: bytes, run: int, pod: int) -> bytes:
    """``body`` about another pod: kube-scheduler asks about each pod once per scheduling cycle."""
    return body.replace(POD_UID, f"{run:08x}-{pod >> 48:04x}-4{pod >> 36 & 0xFFF:03x}-8{pod >> 24 & 0xFFF:03x}-{pod & 0xFFFFFF:012x}".encode(), 1)


class Client:
    """One kept-alive connection to an extender, sending it pods as kube-scheduler does.

    For each pod (``body``, its UID changed) filter, then prioritize over the same nodes (every
    node passes the filter here), one request at a time.
    """

    def __init__(self, port: int, body: bytes) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.body = body
        self.run = secrets.randbits(32)  # this client's pods only: not those of another scenario or client
        self.pods = 0  # sent so far

    def send_pod(self) -> list[float]:
        """One pod's requests: the seconds each verb took, in ``VERBS`` order."""
        self.pods += 1
        this = pod_body(self.body, self.run, self.pods)
        seconds = []
        for verb in VERBS:
            started = time.perf_counter()
            self.conn.request("POST", f"/scheduler/{verb}", this, _HEADERS)
            reply = self.conn.getresponse()
            data = reply.read()
            seconds.append(time.perf_counter() - started)
            if reply.status != 200:
                raise RuntimeError(f"{verb}: HTTP {reply.status}: {data[:200]!r}")
        return seconds

    def close(self) -> None:
        self.conn.close()


def drive(
    port: int,
    body: bytes,
    requests: int,
    warmup: int,
    warmup_seconds: float = WARMUP_SECONDS,
    window: list[float] | None = None,
) -> dict[str, list[float]]:
    """One :class:`Client`'s pods until ``requests`` are measured; each verb's requests' seconds.

    The first ``warmup`` pods, and all of the first ``warmup_seconds``, are not measured: the
    figures are the steady state of a cluster whose node names the extender has seen before
    (it creates each new node's gauge series once, a few hundred per second).
    """
    client = Client(port, body)
    latencies: dict[str, list[float]] = {verb: [] for verb in VERBS}
    began = time.perf_counter()
    while len(latencies[VERBS[-1]]) < requests:
        measured = client.pods >= warmup and time.perf_counter() - began >= warmup_seconds
        if measured and window is not None and not window:
            window.append(time.perf_counter())
        seconds = client.send_pod()
        if measured:
            for verb, elapsed in zip(VERBS, seconds, strict=True):
                latencies[verb].append(elapsed)
    if window is not None:
        window.append(time.perf_counter())  # perf_counter is CLOCK_MONOTONIC: comparable across processes
    client.close()
    return latencies


def drive_in_turn(
    ports: dict[str, int],
    body: bytes,
    requests: int,
    warmup: int,
    warmup_seconds: float = WARMUP_SECONDS,
    block_pods: int = BLOCK_PODS,
) -> dict[str, dict[str, list[float]]]:
    """:func:`drive` for several servers at once, one client each, taking turns.

    The warm-up alternates pod by pod until every client has sent ``warmup`` pods and
    ``warmup_seconds`` have passed; then each server in turn gets ``block_pods`` pods, the
    order reversed every block, until each has ``requests`` measured. Per server, each verb's
    requests' seconds.
    """
    clients = {label: Client(port, body) for label, port in ports.items()}
    began = time.perf_counter()
    while min(c.pods for c in clients.values()) < warmup or time.perf_counter() - began < warmup_seconds:
        for client in clients.values():
            client.send_pod()
    latencies: dict[str, dict[str, list[float]]] = {label: {verb: [] for verb in VERBS} for label in clients}
    order = list(clients)
    block = 0
    while (done := len(latencies[order[0]][VERBS[-1]])) < requests:
        for label in order if block % 2 == 0 else order[::-1]:
            for _ in range(min(block_pods, requests - done)):
                for verb, elapsed in zip(VERBS, clients[label].send_pod(), strict=True):
                    latencies[label][verb].append(elapsed)
        block += 1
    for client in clients.values():
        client.close()
    return latencies


def _drive_worker(args: tuple[int, bytes, int, int, float]) -> tuple[dict[str, list[float]], float, float]:
    """``drive`` in a client process: its latencies and the span of its measured requests."""
    port, body, requests, warmup, warmup_seconds = args
    window: list[float] = []
    latencies = drive(port, body, requests, warmup, warmup_seconds, window)
    return latencies, window[0], window[1]


def measure(
    ports: dict[str, int],
    body: bytes,
    requests: int,
    connections: int,
    warmup_seconds: float = WARMUP_SECONDS,
    block_pods: int = BLOCK_PODS,
) -> dict[str, dict[str, dict[str, float]]]:
    """Per server and verb: p50 and p99 in ms, and requests/s.

    One client: the servers in turn (:func:`drive_in_turn`), each verb's requests over the
    time they took (its rate if served alone). Several: one server after the other, the
    verb's requests over the span from the first client's first measured request to the last
    client's last, the rate the clients observed; each pod sends one request of each verb, so
    the verbs' rates are the pods' rate.
    """
    warmup = max(5, requests // 10)
    if connections == 1:
        return {
            label: _figures(latencies, None)
            for label, latencies in drive_in_turn(ports, body, requests, warmup, warmup_seconds, block_pods).items()
        }
    figures = {}
    for label, port in ports.items():
        # Throughput over the span in which all clients were measuring (no pool start-up, no warm-up).
        with mp.Pool(connections) as pool:
            parts = pool.map(_drive_worker, [(port, body, requests, warmup, warmup_seconds)] * connections)
        merged = {verb: [x for part, _, _ in parts for x in part[verb]] for verb in VERBS}
        figures[label] = _figures(merged, max(end for _, _, end in parts) - min(start for _, start, _ in parts))
    return figures


def _figures(latencies: dict[str, list[float]], wall: float | None) -> dict[str, dict[str, float]]:
    """p50, p99 and requests/s per verb; ``wall`` None: each verb's requests over their own time."""
    figures = {}
    for verb in VERBS:
        xs = sorted(latencies[verb])
        figures[verb] = {
            "p50_ms": 1000 * statistics.median(xs),
            "p99_ms": 1000 * xs[min(len(xs) - 1, int(0.99 * len(xs)))],
            "requests_per_second": len(xs) / (sum(xs) if wall is None else wall),
        }
    return figures


def _workers(text: str) -> int:
    """``--workers`` within the bounds of the extender's ``server.workers``."""
    from joulesched.extender.config import ServerConfig
    from joulesched.policy.validate import limit_problems

    value = int(COUNT(text))
    for problem in limit_problems(replace(ServerConfig(), workers=value), "server"):
        where, _, what = problem.partition(": ")
        if where == "server.workers":
            raise argparse.ArgumentTypeError(f"{what} (the bounds of the extender's server.workers)")
    return value


MODES = ("names", "nodes")


def _scenarios(text: str) -> list[tuple[str, int]]:
    """``mode:count,...``: mode ``names`` (NodeNames) or ``nodes`` (full Nodes), count 1 or more."""
    out = []
    for item in text.split(","):
        mode, sep, count = item.strip().partition(":")
        if not sep or mode not in MODES:
            raise argparse.ArgumentTypeError(f"{item!r}: must be MODE:COUNT with MODE names or nodes")
        try:
            n = int(count)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: the count must be a whole number, got {count!r}") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: the count must be 1 or more")
        out.append((mode, n))
    return out


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="joulesched bench",
        description="Measure the extender's latency and throughput against a constant-score floor, on loopback.",
    )
    p.add_argument(
        "--requests", type=COUNT, default=400, help="measured requests per scenario and connection (1 or more)"
    )
    p.add_argument("--workers", type=_workers, default=2, help="gunicorn workers of the extender (1..64)")
    p.add_argument(
        "--connections", type=COUNT, default=1, help="parallel kept-alive clients (1: as kube-scheduler)"
    )
    p.add_argument(
        "--scenarios",
        type=_scenarios,
        default=",".join(f"{m}:{n}" for m, n in SCENARIOS),
        help="mode:count,... (mode names or nodes; count 1 or more)",
    )
    p.add_argument("--out", help="also write the figures as JSON here")
    p.add_argument(
        "--warmup-seconds", type=number(at_least=0, unit="seconds"), default=WARMUP_SECONDS, help="unmeasured seconds before each measurement"
    )
    p.add_argument(
        "--block-pods", type=COUNT, help=f"with one client, pods sent to one server before the other's turn (default {BLOCK_PODS})"
    )
    a = p.parse_args(list(argv))
    if a.block_pods is not None and a.connections != 1:
        p.error("--block-pods is for one client (--connections 1): several are measured one server after the other")
    if a.block_pods is None:
        a.block_pods = BLOCK_PODS
    if a.out:
        wrong = _unwritable(Path(a.out))
        if wrong:
            p.error(f"argument --out: {wrong}")
    scenarios: list[tuple[str, int]] = a.scenarios
    largest = max(n for _, n in scenarios)

    tmp = Path(tempfile.mkdtemp(prefix="joulesched-bench-"))
    (tmp / "nodes.yaml").write_text(yaml.safe_dump(profile_document(largest)))
    (tmp / "config.yaml").write_text(yaml.safe_dump({"profiles": {"file": {"path": str(tmp / "nodes.yaml")}}}))
    ext_port, floor_port = free_port(), free_port()
    log = (tmp / "extender.log").open("wb")
    extender = subprocess.Popen(
        [sys.executable, "-m", "joulesched", "extender", "--config", str(tmp / "config.yaml"),
         "--listen", f"127.0.0.1:{ext_port}", "--workers", str(a.workers)],
        stdout=log, stderr=log,
    )
    floor = mp.Process(target=run_floor, args=(floor_port,), daemon=True)
    floor.start()
    results: list[dict[str, Any]] = []
    try:
        try:
            wait_ready(ext_port, extender)
        except RuntimeError as err:
            print(f"joulesched bench: {err}; see {tmp / 'extender.log'}", file=sys.stderr)
            return 1
        for mode, n in scenarios:
            body = request_body(mode, n)
            requests = a.requests if n <= 1000 else max(50, a.requests // 4)
            if mode == "nodes" and n >= 1000:
                requests = max(50, a.requests // 8)
            figures = measure(
                {"floor": floor_port, "joulesched": ext_port}, body, requests, a.connections, a.warmup_seconds, a.block_pods
            )
            for verb in VERBS:
                row: dict[str, Any] = {"mode": mode, "nodes": n, "verb": verb, "body_kib": round(len(body) / 1024, 1)}
                row["floor"] = figures["floor"][verb]
                row["joulesched"] = figures["joulesched"][verb]
                row["p99_ratio"] = row["joulesched"]["p99_ms"] / row["floor"]["p99_ms"]
                results.append(row)
                print(_line(row), flush=True)
    finally:
        extender.terminate()
        extender.wait(timeout=20)
        floor.terminate()
        log.close()
    meta = {
        "command": "joulesched bench " + " ".join(argv),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "workers": a.workers,
        "connections": a.connections,
        # one client: the two servers in turn, block_pods pods at a time; several: one after the other
        "in_turn_block_pods": a.block_pods if a.connections == 1 else None,
        "date": time.strftime("%Y-%m-%d"),
    }
    if a.out:
        try:
            Path(a.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
        except OSError as err:
            print(f"joulesched bench: --out {a.out}: cannot write: {err.strerror or err}", file=sys.stderr)
            return 1
    return 0


def _unwritable(path: Path) -> str | None:
    """Why the figures could not be written to ``path`` at the end, checked before measuring."""
    if path.is_dir():
        return f"{path} is a folder"
    if not path.parent.exists():
        return f"the folder {path.parent} does not exist"
    if not path.parent.is_dir():
        return f"{path.parent} is not a folder"
    if not os.access(path.parent, os.W_OK):
        return f"cannot write in {path.parent}"
    return None


def _line(row: dict[str, Any]) -> str:
    j, f = row["joulesched"], row["floor"]
    label = f"{row['nodes']:>5} {'NodeNames' if row['mode'] == 'names' else 'Nodes':<9} {row['verb']:<10}"
    return (
        f"{label} joulesched p50 {j['p50_ms']:7.2f} ms p99 {j['p99_ms']:7.2f} ms {j['requests_per_second']:7.0f}/s | "
        f"floor p50 {f['p50_ms']:7.2f} ms p99 {f['p99_ms']:7.2f} ms {f['requests_per_second']:7.0f}/s | p99 ratio {row['p99_ratio']:.2f}"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
