"""Soak: honest kube-scheduler-like load for ``--seconds``, counting errors and watching memory.

Starts ``joulesched extender`` on loopback as shipped (one gunicorn worker, the buffered
worker) on a profile file of 1,000 nodes, and runs ``--clients`` client processes, each with
one kept-alive connection sending prioritize and filter calls one at a time (100 and 1,000
NodeNames, a new pod UID each call). Every 10 s it samples the RSS of the master and the
workers. Prints requests, req/s, errors (any status but 200, any connection error), p50/p99
per minute, and the memory slope (least squares over the second half of the run, MB/min).

    python bench/soak_extender.py --seconds 600 --out bench/results/soak-extender.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from joulesched.extender.bench import node_name, profile_document  # noqa: E402
from joulesched.extender.demo import free_port, start_extender, stop, wait_ready  # noqa: E402


def client(port: int, seconds: float, seed: int) -> dict[str, Any]:
    pod = orjson.loads(
        orjson.dumps(
            {
                "metadata": {"name": "soak", "namespace": "default"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
            }
        )
    )
    names = {n: [node_name(i) for i in range(n)] for n in (100, 1000)}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    end = time.monotonic() + seconds
    by_minute: dict[int, list[float]] = {}
    errors = 0
    count = 0
    started = time.monotonic()
    while time.monotonic() < end:
        count += 1
        pod["metadata"]["uid"] = f"{seed}-{count}"
        verb = "prioritize" if count % 2 else "filter"
        body = orjson.dumps({"Pod": pod, "NodeNames": names[1000 if count % 10 == 0 else 100]})
        t0 = time.perf_counter()
        try:
            conn.request("POST", f"/scheduler/{verb}", body, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            reply.read()
            if reply.status != 200:
                errors += 1
        except OSError:
            errors += 1
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        by_minute.setdefault(int((time.monotonic() - started) // 60), []).append(time.perf_counter() - t0)
    conn.close()
    return {"count": count, "errors": errors, "by_minute": by_minute}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def slope(points: list[tuple[float, float]]) -> float:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--out")
    a = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="joulesched-soak-"))
    (tmp / "nodes.yaml").write_text(yaml.safe_dump(profile_document(1000)))
    (tmp / "config.yaml").write_text(yaml.safe_dump({"profiles": {"file": {"path": str(tmp / "nodes.yaml")}}}))
    port = free_port()
    proc = start_extender(tmp / "config.yaml", port, tmp / "extender.log")
    samples: list[dict[str, Any]] = []
    try:
        wait_ready(port, proc)
        began = time.monotonic()
        with mp.Pool(a.clients) as pool:
            pending = pool.starmap_async(client, [(port, a.seconds, i) for i in range(a.clients)])
            while not pending.ready():
                workers = [int(x) for x in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
                samples.append(
                    {
                        "t": time.monotonic() - began,
                        "master_mb": rss_mb(proc.pid),
                        "workers_mb": [rss_mb(w) for w in workers],
                    }
                )
                pending.wait(10)
            results = pending.get()
    finally:
        stop(proc)
    total = sum(r["count"] for r in results)
    errors = sum(r["errors"] for r in results)
    minutes: dict[int, list[float]] = {}
    for r in results:
        for minute, values in r["by_minute"].items():
            minutes.setdefault(int(minute), []).extend(values)
    per_minute = []
    for minute in sorted(minutes):
        values = sorted(minutes[minute])
        per_minute.append(
            {
                "minute": minute,
                "requests": len(values),
                "p50_ms": 1000 * values[len(values) // 2],
                "p99_ms": 1000 * values[int(0.99 * (len(values) - 1))],
            }
        )
    half = [s for s in samples if s["t"] >= a.seconds / 2]
    worker_slope = slope([(s["t"] / 60, sum(s["workers_mb"])) for s in half]) if len(half) > 2 else 0.0
    master_slope = slope([(s["t"] / 60, s["master_mb"]) for s in half]) if len(half) > 2 else 0.0
    summary = {
        "requests": total,
        "requests_per_second": total / a.seconds,
        "errors": errors,
        "worker_mb_per_minute": worker_slope,
        "master_mb_per_minute": master_slope,
        "rss_first": samples[0] if samples else None,
        "rss_last": samples[-1] if samples else None,
    }
    print(json.dumps(summary, indent=1))
    for row in per_minute:
        print(
            f"minute {row['minute']:>2}: {row['requests']:>6} requests  p50 {row['p50_ms']:.2f} ms  p99 {row['p99_ms']:.2f} ms"
        )
    if a.out:
        meta = {
            "command": "python bench/soak_extender.py " + " ".join(argv),
            "clients": a.clients,
            "date": time.strftime("%Y-%m-%d %H:%M"),
        }
        Path(a.out).write_text(
            json.dumps({"meta": meta, "summary": summary, "per_minute": per_minute, "samples": samples}, indent=1)
        )
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
