"""The first request after an idle spell, joulesched against the floor of ``joulesched bench``.

Both servers are started as ``joulesched bench`` starts them (the extender from its profile
document, the stdlib floor) and driven by its client, pod by pod in turn: filter, then
prioritize. Every ``--every`` pods the client pauses ``--pause-ms``: asleep (``sleep``, the CPU
may idle), busy in a loop (``spin``, the client's CPU stays busy), or not at all (``none``).
Printed per server and verb: the median of the first pod after each pause, the median and p99
of the others, and the p99 of all. With ``--in-process`` the extender's verb endpoint is
called in this process instead (``bench/verb_cost.py``'s app, no HTTP), the pauses made in the
same thread: whether a pause slows what follows through the idle CPU or through the server's
own path back from a wait. Not a timed test: the ratios between the modes, in one run, are
the figures.

    python bench/idle_spell.py --modes none,sleep,spin --pods 3000 [--in-process]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from joulesched.extender import bench
from joulesched.extender.demo import free_port, wait_ready


def pause(mode: str, seconds: float) -> None:
    if mode == "sleep":
        time.sleep(seconds)
    elif mode == "spin":
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass


def p99(xs: Sequence[float]) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(0.99 * len(ys)))]


def run(mode: str, ports: dict[str, int], body: bytes, pods: int, every: int, pause_seconds: float) -> list[str]:
    clients = {label: bench.Client(port, body) for label, port in ports.items()}
    began = time.perf_counter()
    while time.perf_counter() - began < bench.WARMUP_SECONDS:
        for client in clients.values():
            client.send_pod()
    seconds: dict[str, list[list[float]]] = {label: [] for label in clients}
    order = list(clients)
    for i in range(pods):
        # Pod by pod the order is reversed, and after each pause too: which server the first
        # pod after a pause reaches first alternates (with an even --every it would not).
        for label in order if (i % every + i // every) % 2 == 0 else order[::-1]:
            seconds[label].append(clients[label].send_pod())
        if i % every == every - 1:
            pause(mode, pause_seconds)
    for client in clients.values():
        client.close()
    return [line for label, per_pod in seconds.items() for line in summary(mode, label, per_pod, every)]


def in_process(modes: Sequence[str], n: int, pods: int, every: int, pause_seconds: float) -> list[str]:
    """The verb endpoint called here, pod by pod, pausing in this thread."""
    import orjson
    from verb_cost import ORDERS, WARM_UP, node_orders, pod, verb_endpoint  # bench/, the script's own directory

    endpoint = verb_endpoint(n, Path(tempfile.mkdtemp(prefix="joulesched-idle-spell-")))
    orders = node_orders(n)
    lines = []
    for m, mode in enumerate(modes):
        first = m * (WARM_UP + pods)  # pods of their own: none the ledger holds from an earlier mode
        bodies = [orjson.dumps({"Pod": pod(first + i), "NodeNames": orders[i % ORDERS]}) for i in range(WARM_UP + pods)]
        per_pod = []
        for i, body in enumerate(bodies):
            if i > WARM_UP and (i - WARM_UP) % every == 0:
                pause(mode, pause_seconds)
            seconds = []
            for verb in bench.VERBS:
                started = time.perf_counter()
                status, reply = endpoint(verb, len(body), lambda _size, b=body: b)
                seconds.append(time.perf_counter() - started)
                if status != 200:
                    raise SystemExit(f"{verb}: HTTP {status}: {bytes(reply)[:300]!r}")
            if i >= WARM_UP:
                per_pod.append(seconds)
        lines += summary(mode, "in process", per_pod, every)
    return lines


def summary(mode: str, label: str, per_pod: Sequence[Sequence[float]], every: int) -> list[str]:
    lines = []
    for v, verb in enumerate(bench.VERBS):
        ms = [1000 * s[v] for s in per_pod]
        first = ms[every::every]  # the pods right after a pause
        others = [x for i, x in enumerate(ms) if i % every != 0 or i == 0]
        lines.append(
            f"| {mode} | {label} | {verb} | {statistics.median(first):.3f} | {statistics.median(others):.3f} "
            f"| {p99(others):.3f} | {p99(ms):.3f} |"
        )
    return lines


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="none,sleep,spin", help="comma-separated: none, sleep, spin")
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--pods", type=int, default=3000, help="measured pods per server and mode")
    p.add_argument("--every", type=int, default=50, help="pods between pauses (joulesched bench's former block)")
    p.add_argument("--pause-ms", type=float, default=20.0, help="the pause (about one block of the other server)")
    p.add_argument("--in-process", action="store_true", help="call the verb endpoint in this process, without HTTP")
    a = p.parse_args(list(argv))
    modes = a.modes.split(",")
    if unknown := [m for m in modes if m not in ("none", "sleep", "spin")]:
        p.error(f"--modes: unknown {unknown}; choose from none, sleep, spin")
    if a.every < 2 or a.pods < 2 * a.every:
        p.error(f"--every must be 2 or more and --pods at least twice --every, got {a.every} and {a.pods}")
    if a.pause_ms < 0 or a.nodes < 1:
        p.error(f"--pause-ms must be 0 or more and --nodes 1 or more, got {a.pause_ms:g} and {a.nodes}")

    header = ["| pause | server | verb | first pod after a pause, p50 ms | the others, p50 ms | the others, p99 ms | all, p99 ms |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    print(f"{a.nodes} NodeNames, {a.pods} pods a mode, a pause of {a.pause_ms:g} ms every {a.every} pods")
    if a.in_process:
        print("\n".join(header + in_process(modes, a.nodes, a.pods, a.every, a.pause_ms / 1000)))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="joulesched-idle-spell-"))
    (tmp / "nodes.yaml").write_text(yaml.safe_dump(bench.profile_document(a.nodes)))
    (tmp / "config.yaml").write_text(yaml.safe_dump({"profiles": {"file": {"path": str(tmp / "nodes.yaml")}}}))
    ext_port, floor_port = free_port(), free_port()
    log = (tmp / "extender.log").open("wb")
    extender = subprocess.Popen(
        [sys.executable, "-m", "joulesched", "extender", "--config", str(tmp / "config.yaml"),
         "--listen", f"127.0.0.1:{ext_port}", "--workers", "2"],
        stdout=log, stderr=log,
    )  # fmt: skip
    floor = mp.Process(target=bench.run_floor, args=(floor_port,), daemon=True)
    floor.start()
    print("\n".join(header), flush=True)
    try:
        wait_ready(ext_port, extender)
        body = bench.request_body("names", a.nodes)
        for mode in modes:
            for line in run(
                mode, {"joulesched": ext_port, "floor": floor_port}, body, a.pods, a.every, a.pause_ms / 1000
            ):
                print(line, flush=True)
    finally:
        extender.terminate()
        extender.wait(timeout=20)
        floor.terminate()
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
