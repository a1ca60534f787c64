"""Can idle and slow clients starve the extender of kube-scheduler's calls?

Starts ``joulesched extender`` on loopback (gunicorn, 2 workers, the shipped server settings)
in each ``--variant`` in turn and, while attackers hold connections open, drives it the way
kube-scheduler does: one kept-alive connection, one prioritize call (100 NodeNames) at a time,
each with a 1 s timeout (deploy/scheduler's ``httpTimeout``); a call that times out drops the
connection and the next one opens a new one, as Go's client does. A second probe opens a new
connection for every call. The attackers, all at once:

* ``--idle`` sockets that connect, send nothing and are renewed every 4.5 s;
* ``--slowloris`` connections that send a request line, then one header line a second;
* ``--liars`` connections that announce ``Content-Length: 1000000``, send 10 bytes and then one
  byte a second;
* ``--chunk-liars`` connections that announce a chunk of ``ffffffffffffffffff`` bytes and hold;
* ``--followers`` connections that send one whole prioritize call, read its answer, and then
  send half of the next call, close the connection 0.2 s later and start again (a thread of
  the worker waits up to 50 ms for a connection's next request: this attacker is for that wait).

Variants: ``buffered`` (this checkout as configured), ``gthread`` (this checkout with gunicorn's
``gthread`` worker and the given ``--threads``/``--keepalive``), ``main`` (the checkout at
``--main``, as shipped there). Prints and writes (``--out``) the share of calls answered within
1 s per variant and probe, and their p50/p99.

    python bench/starve_extender.py --seconds 30 --variant main,gthread,buffered
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from joulesched.extender.bench import profile_document, request_body  # noqa: E402
from joulesched.extender.demo import free_port, start_extender, stop, wait_ready  # noqa: E402

TIMEOUT = 1.0
PATH = "/scheduler/prioritize"


def start(variant: str, a: argparse.Namespace, tmp: Path, port: int) -> subprocess.Popen[bytes]:
    config: dict[str, Any] = {"profiles": {"file": {"path": str(tmp / "nodes.yaml")}}}
    checkout = ROOT
    if variant == "gthread":
        config["server"] = {"worker": "gthread", "threads": a.threads, "keepalive_seconds": a.keepalive}
    elif variant == "main":
        if not a.main:
            raise SystemExit("the main variant runs the previous release: give its checkout with --main DIR")
        checkout = Path(a.main)
    elif variant != "buffered":
        raise SystemExit(f"unknown variant {variant!r}")
    (tmp / f"{variant}.yaml").write_text(yaml.safe_dump(config))
    return start_extender(tmp / f"{variant}.yaml", port, tmp / f"{variant}.log", checkout=str(checkout))


class Attack:
    def __init__(self, port: int, a: argparse.Namespace, body: bytes) -> None:
        self.port = port
        self.call = (
            f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.stop = threading.Event()
        self.opened = 0
        self.threads = [
            *(threading.Thread(target=self._loop, args=(self._idle,), daemon=True) for _ in range(a.idle)),
            *(threading.Thread(target=self._loop, args=(self._slowloris,), daemon=True) for _ in range(a.slowloris)),
            *(threading.Thread(target=self._loop, args=(self._liar,), daemon=True) for _ in range(a.liars)),
            *(threading.Thread(target=self._loop, args=(self._chunk_liar,), daemon=True) for _ in range(a.chunk_liars)),
            *(threading.Thread(target=self._loop, args=(self._follower,), daemon=True) for _ in range(a.followers)),
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _loop(self, attack: Any) -> None:
        while not self.stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                    self.opened += 1
                    attack(s)
            except OSError:
                self.stop.wait(0.05)

    def _idle(self, s: socket.socket) -> None:
        self.stop.wait(4.5)

    def _trickle(self, s: socket.socket, head: bytes, drip: bytes) -> None:
        s.sendall(head)
        while not self.stop.wait(1.0):
            s.sendall(drip)
            s.settimeout(0.0)
            try:
                if s.recv(65536) == b"":
                    return  # the server closed it: open another
            except BlockingIOError:
                pass
            finally:
                s.settimeout(5)

    def _slowloris(self, s: socket.socket) -> None:
        self._trickle(s, f"POST {PATH} HTTP/1.1\r\nHost: x\r\n".encode(), b"X-a: b\r\n")

    def _liar(self, s: socket.socket) -> None:
        head = f'POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{{"Pod": {{'.encode()
        self._trickle(s, head, b" ")

    def _follower(self, s: socket.socket) -> None:
        s.sendall(self.call)
        answer = http.client.HTTPResponse(s)
        try:
            answer.begin()
            answer.read()
        except http.client.HTTPException:
            return  # a reply cut short or malformed: open another
        s.sendall(self.call[: len(self.call) // 2])
        self.stop.wait(0.2)  # past the worker's wait for it; then again on a new connection

    def _chunk_liar(self, s: socket.socket) -> None:
        head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n{{".encode()
        self._trickle(s, head, b" ")


def probe(port: int, body: bytes, seconds: float, keep_alive: bool) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    missed = 0
    conn: http.client.HTTPConnection | None = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
            conn.request("POST", PATH, body, headers)
            reply = conn.getresponse()
            reply.read()
            elapsed = time.perf_counter() - started
            if reply.status != 200 or elapsed > TIMEOUT:
                missed += 1
            latencies.append(elapsed)
            if not keep_alive or reply.will_close:
                conn.close()
                conn = None
        except OSError:
            missed += 1
            latencies.append(time.perf_counter() - started)
            if conn is not None:
                conn.close()
            conn = None
        time.sleep(0.02)
    if conn is not None:
        conn.close()
    latencies.sort()
    calls = len(latencies)
    return {
        "calls": calls,
        "within_1s": calls - missed,
        "share_within_1s": (calls - missed) / calls if calls else 0.0,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else None,
        "p99_ms": 1000 * latencies[min(calls - 1, int(0.99 * calls))] if latencies else None,
    }


def run_variant(variant: str, a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    port = free_port()
    proc = start(variant, a, tmp, port)
    body = request_body("names", 100)
    try:
        wait_ready(port, proc)
        attack = Attack(port, a, body)
        attack.start()
        time.sleep(2.0)  # every attacker connected
        results: dict[str, Any] = {}
        out: dict[str, dict[str, Any]] = {}
        threads = [
            threading.Thread(
                target=lambda k=k: out.__setitem__(
                    "kept_alive" if k else "new_connection", probe(port, body, a.seconds, k)
                )
            )
            for k in (True, False)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        attack.stop.set()
        results.update(out)
        results["attack_connections_opened"] = attack.opened
        return results
    finally:
        stop(proc)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", default="main,gthread,buffered", help="comma-separated: main, gthread, buffered")
    p.add_argument("--seconds", type=float, default=30.0, help="probe time per variant")
    p.add_argument("--idle", type=int, default=32)
    p.add_argument("--slowloris", type=int, default=8)
    p.add_argument("--liars", type=int, default=8)
    p.add_argument("--chunk-liars", type=int, default=4)
    p.add_argument("--followers", type=int, default=0)
    p.add_argument("--threads", type=int, default=32, help="threads per worker of the gthread variant")
    p.add_argument("--keepalive", type=float, default=5.0, help="keep-alive seconds of the gthread variant")
    p.add_argument("--main", help="checkout of the previous release (the main variant needs it)")
    p.add_argument("--out", help="write the figures as JSON here")
    a = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="joulesched-starve-"))
    (tmp / "nodes.yaml").write_text(yaml.safe_dump(profile_document(100)))
    report: dict[str, Any] = {"command": "python bench/starve_extender.py " + " ".join(argv), "results": {}}
    for variant in a.variant.split(","):
        r = run_variant(variant, a, tmp)
        report["results"][variant] = r
        for kind in ("kept_alive", "new_connection"):
            x = r[kind]
            print(
                f"{variant:<9} {kind:<15} {x['within_1s']:>5}/{x['calls']:<5} within 1 s ({100 * x['share_within_1s']:.1f} %)"
                f"  p50 {x['p50_ms']:.1f} ms  p99 {x['p99_ms']:.1f} ms",
                flush=True,
            )
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
