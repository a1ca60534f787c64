"""Memory of the extender per request: body sizes, and the worker's peak RSS over its resting RSS.

Starts ``joulesched extender`` on loopback as shipped (one gunicorn worker, the buffered worker,
the default ``max_request_bytes``) on a profile file of 5,000 nodes, and measures the resting
RSS of the master and the worker. Then, for each body (``names:N`` — N NodeNames, what
kube-scheduler sends with ``nodeCacheCapable: true``; ``nodes:N`` — N full v1.Node objects;
``names-max`` — short names filling ``max_request_bytes``, refused for naming more than
``wire.MAX_NODES``), it resets the worker's high-water
mark (``/proc/PID/clear_refs``), sends the body to prioritize and to filter ``--repeat`` times
over one kept-alive connection, and reads the peak (``VmHWM``) and the RSS afterwards.

    python bench/memory_extender.py --out bench/results/memory-extender.json

``--shipped`` measures only the resting RSS of the extender as deploy/ ships it: its
deploy/extender/config.yaml (Prometheus source, pod watch, its worker count) with the
Prometheus URL and a kubeconfig pointed at a closed loopback port, so that everything the
shipped extender imports and starts is there; ``--workers`` overrides the count and
``--checkout`` runs another checkout (its code and its deploy/ config).

    python bench/memory_extender.py --shipped
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from joulesched.extender.bench import profile_document, request_body  # noqa: E402
from joulesched.extender.config import ExtenderConfig  # noqa: E402
from joulesched.extender.demo import free_port, start_extender, stop, wait_ready  # noqa: E402

MB = 1024 * 1024


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def children(pid: int) -> list[int]:
    return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def names_filling(limit: int) -> bytes:
    """A prioritize body of short node names just under ``limit`` bytes."""
    pod = orjson.loads(request_body("names", 1))["Pod"]
    head = len(orjson.dumps({"Pod": pod, "NodeNames": []}))
    count = (limit - head) // 14 - 16  # '"n0000000001",' is 14 bytes
    return orjson.dumps({"Pod": pod, "NodeNames": [f"n{i:010d}" for i in range(count)]})


def send(conn: http.client.HTTPConnection, verb: str, body: bytes) -> int:
    conn.request("POST", f"/scheduler/{verb}", body, {"Content-Type": "application/json"})
    reply = conn.getresponse()
    reply.read()
    return reply.status


def workers_flag(workers: int | None) -> tuple[str, ...]:
    return () if workers is None else ("--workers", str(workers))


def shipped(workers: int | None, checkout: str | None) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="joulesched-memory-"))
    closed = free_port()  # nothing listens there: connections are refused at once
    doc = yaml.safe_load((Path(checkout or ROOT) / "deploy" / "extender" / "config.yaml").read_text())
    doc["profiles"]["prometheus"]["url"] = f"http://127.0.0.1:{closed}"
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{closed}"}}],
        "users": [{"name": "u", "user": {"token": "x"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    (tmp / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    doc["kubeconfig"] = str(tmp / "kubeconfig")
    (tmp / "config.yaml").write_text(yaml.safe_dump(doc))
    port = free_port()
    proc = start_extender(tmp / "config.yaml", port, tmp / "extender.log", *workers_flag(workers), checkout=checkout)
    try:
        wait_ready(port, proc, timeout=60, path="/healthz")  # /readyz stays 503 (no Prometheus)
        time.sleep(8.0)  # the pod watch's and the refresh's first tries, the gauge ticks
        pids = [proc.pid, *children(proc.pid)]
        rss = [status_kb(pid, "VmRSS") / 1024 for pid in pids]
        print(
            f"resting RSS: master {rss[0]:.1f} MB, workers {[round(r, 1) for r in rss[1:]]} MB, total {sum(rss):.1f} MB"
        )
    finally:
        stop(proc)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bodies", default="names:1000,names:5000,names:20000,nodes:1000,nodes:5000,names-max")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, help="gunicorn workers (default: the config's)")
    p.add_argument("--shipped", action="store_true", help="only the resting RSS of deploy/extender/config.yaml")
    p.add_argument("--checkout", help="run this checkout's code (and, with --shipped, its deploy/ config): A/B")
    p.add_argument("--out")
    a = p.parse_args(argv)
    if a.shipped:
        return shipped(a.workers, a.checkout)
    max_bytes = ExtenderConfig().max_request_bytes
    tmp = Path(tempfile.mkdtemp(prefix="joulesched-memory-"))
    (tmp / "nodes.yaml").write_text(yaml.safe_dump(profile_document(5000)))
    (tmp / "config.yaml").write_text(yaml.safe_dump({"profiles": {"file": {"path": str(tmp / "nodes.yaml")}}}))
    port = free_port()
    proc = start_extender(
        tmp / "config.yaml", port, tmp / "extender.log", *workers_flag(a.workers), checkout=a.checkout
    )
    rows: list[dict[str, Any]] = []
    try:
        wait_ready(port, proc)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        small = request_body("names", 100)
        for _ in range(50):
            send(conn, "prioritize", small)
            send(conn, "filter", small)
        time.sleep(2.0)  # the gauge writer's first ticks
        workers = children(proc.pid)
        rest = {pid: status_kb(pid, "VmRSS") for pid in workers}
        master = status_kb(proc.pid, "VmRSS")
        print(
            f"resting RSS: master {master / 1024:.1f} MB, workers {[round(r / 1024, 1) for r in rest.values()]} MB",
            flush=True,
        )
        for spec in a.bodies.split(","):
            if spec == "names-max":
                body = names_filling(max_bytes)
            else:
                mode, n = spec.split(":")
                body = request_body(mode, int(n))
            for verb in ("prioritize", "filter"):
                for pid in workers:
                    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
                before = {pid: status_kb(pid, "VmRSS") for pid in workers}
                codes = [send(conn, verb, body) for _ in range(a.repeat)]
                peak = max(status_kb(pid, "VmHWM") - before[pid] for pid in workers)
                hwm = max(status_kb(pid, "VmHWM") - rest[pid] for pid in workers)
                after = max(status_kb(pid, "VmRSS") - rest[pid] for pid in workers)
                row = {
                    "body": spec,
                    "verb": verb,
                    "body_mb": round(len(body) / MB, 3),
                    "codes": sorted(set(codes)),
                    "peak_over_rss_before_mb": round(peak / 1024, 1),
                    "rss_over_rest_after_mb": round(after / 1024, 1),
                    "peak_over_rest_mb": round(hwm / 1024, 1),
                    "peak_per_body_byte": round(peak * 1024 / len(body), 2),
                }
                rows.append(row)
                print(
                    f"{spec:<12} {verb:<10} body {row['body_mb']:8.3f} MB  HTTP {row['codes']}  peak +{row['peak_over_rss_before_mb']:6.1f} MB"
                    f" ({row['peak_per_body_byte']:.2f}x body), +{row['peak_over_rest_mb']:.1f} MB over rest;"
                    f" after +{row['rss_over_rest_after_mb']:.1f} MB over rest",
                    flush=True,
                )
        conn.close()
        final = {pid: status_kb(pid, "VmRSS") for pid in workers}
    finally:
        stop(proc)
    if a.out:
        meta = {"command": "python bench/memory_extender.py " + " ".join(argv), "max_request_bytes": max_bytes}
        doc = {
            "meta": meta,
            "rest_kb": {"master": master, **{str(k): v for k, v in rest.items()}},
            "final_kb": final,
            "rows": rows,
        }
        Path(a.out).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
