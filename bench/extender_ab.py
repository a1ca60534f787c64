"""Two checkouts' extenders side by side: latency and server CPU per verb, in alternating blocks.

On a shared machine whose speed drifts by tens of percent from minute to minute, two runs one
after the other compare two minutes, not two releases. This starts both extenders at once
(``python -m joulesched extender``, one gunicorn worker each, run from each checkout so that
each serves its own code; ``joulesched bench``'s profiles and request), then drives them as
kube-scheduler does (one kept-alive connection, filter then prioritize for each pod) in
alternating blocks of pods, the order of the two swapped every block, so that drift falls on
both alike. Per extender and verb it prints the p50 and p99 over all blocks, and the serving
thread's CPU per request inside the verb endpoint (``bench/cpu_parts``: parse, policy,
ledger, reply, metrics). Not a timed test: run by hand, and record the figures in
docs/benchmarks.md.

    python bench/extender_ab.py --previous ../previous-checkout --nodes 100 --blocks 10
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from joulesched.extender.bench import VERBS, drive, profile_document, request_body
from joulesched.extender.demo import free_port, wait_ready

HERE = Path(__file__).resolve().parent
PARTS_SECONDS = 2.5  # bench/cpu_parts rewrites its file every 2 s


def verb_cpu(prefix: str) -> dict[str, tuple[int, float]]:
    """(requests, CPU ms) per verb so far, from bench/cpu_parts' file of the extender's worker."""
    found: dict[str, tuple[int, float]] = {}
    for path in glob.glob(f"{prefix}.*"):
        for line in Path(path).read_text().splitlines():
            if line.startswith("verb:"):
                part, n, cpu, _ = line.split()
                found[part[5:]] = (int(n.removeprefix("n=")), float(cpu.removeprefix("cpu_ms=")))
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--previous", required=True, help="the other checkout (its top folder)")
    p.add_argument("--this", default=str(HERE.parent), help="this checkout (default: the one holding this script)")
    p.add_argument("--nodes", type=int, default=100, help="candidate node names a request (names mode)")
    p.add_argument("--blocks", type=int, default=10, help="blocks of pods for each extender")
    p.add_argument("--pods", type=int, default=300, help="pods a block")
    args = p.parse_args()
    if args.nodes < 1 or args.blocks < 1 or args.pods < 1:
        p.error("--nodes, --blocks and --pods must be 1 or more")
    checkouts = {"previous": Path(args.previous).resolve(), "this": Path(args.this).resolve()}
    for label, checkout in checkouts.items():
        if not (checkout / "joulesched" / "__main__.py").is_file():
            p.error(f"--{label} {checkout}: not a joulesched checkout (no joulesched/__main__.py)")
    work = Path(tempfile.mkdtemp(prefix="joulesched-ab-"))
    (work / "nodes.yaml").write_text(yaml.safe_dump(profile_document(args.nodes)))
    (work / "config.yaml").write_text(yaml.safe_dump({"profiles": {"file": {"path": str(work / "nodes.yaml")}}}))
    servers: dict[str, tuple[subprocess.Popen[bytes], int, str]] = {}
    try:
        for label, checkout in checkouts.items():
            port = free_port()
            prefix = str(work / f"parts-{label}")
            env = dict(os.environ, PYTHONPATH=f"{HERE / 'cpu_parts'}{os.pathsep}{checkout}", JOULESCHED_CPU_PARTS=prefix)
            log = (work / f"{label}.log").open("wb")
            argv = [sys.executable, "-m", "joulesched", "extender", "--config", str(work / "config.yaml"),
                    "--listen", f"127.0.0.1:{port}", "--workers", "1"]  # fmt: skip
            # From the checkout: ``-m`` puts the working directory first on sys.path.
            servers[label] = (subprocess.Popen(argv, cwd=checkout, env=env, stdout=log, stderr=log), port, prefix)
        for proc, port, _ in servers.values():
            wait_ready(port, proc)
        body = request_body("names", args.nodes)
        for _, port, _ in servers.values():
            drive(port, body, args.pods, 0, 0.0)  # warm-up: each node's gauge series made, caches filled
        time.sleep(PARTS_SECONDS)
        before = {label: verb_cpu(prefix) for label, (_, _, prefix) in servers.items()}
        latencies: dict[str, dict[str, list[float]]] = {label: {verb: [] for verb in VERBS} for label in servers}
        order = list(servers)
        for block in range(args.blocks):
            for label in order if block % 2 == 0 else order[::-1]:
                for verb, seconds in drive(servers[label][1], body, args.pods, 0, 0.0).items():
                    latencies[label][verb] += seconds
        time.sleep(PARTS_SECONDS)
        print(f"# {args.nodes} names, {args.blocks} blocks of {args.pods} pods each, alternating; {os.cpu_count()} CPUs")
        for label, (_, _, prefix) in servers.items():
            after = verb_cpu(prefix)
            cells = []
            for verb in VERBS:
                xs = sorted(latencies[label][verb])
                n = after[verb][0] - before[label].get(verb, (0, 0.0))[0]
                cpu = after[verb][1] - before[label].get(verb, (0, 0.0))[1]
                cells.append(
                    f"{verb} p50 {1e3 * statistics.median(xs):.3f} ms p99 {1e3 * xs[min(len(xs) - 1, int(0.99 * len(xs)))]:.3f} ms"
                    f" CPU {1e3 * cpu / n:.0f} us"
                )
            print(f"{label:8s} {checkouts[label]}: " + "; ".join(cells), flush=True)
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=20)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
