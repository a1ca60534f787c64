"""CPU of a new TLS connection to the real kube-apiserver, the ways the binder could open one.

A real etcd and kube-apiserver on loopback (the e2e harness, tests/e2e/cluster.py) and the
admin kubeconfig (a client certificate); through the binder's ``ApiConnections``
(extender/kube.py), each way ``--connections`` times, the thread's CPU clock, medians:

* ``context``: making the TLS context alone (CA file, client certificate and key);
* ``new context``: a context made for the connection, the TLS handshake and one request;
* ``shared context``: the same with one context for every connection (what the binder does);
* ``resumed``: the same, resuming the last connection's TLS session;
* ``open``: one request on a connection already open.

Not a timed test: run by hand, and record the figures in docs/benchmarks.md.

    JOULESCHED_K8S_BIN_DIR=~/.cache/joulesched/k8s/v1.37.2/bin PYTHONPATH=. python bench/api_connection_cost.py
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from cluster import ControlPlane  # noqa: E402

from joulesched.extender.kube import ApiConnections, api_client, preload  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--connections", type=int, default=40, help="connections (or contexts) each way, each round")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    bin_dir = os.environ.get("JOULESCHED_K8S_BIN_DIR")
    if not bin_dir:
        p.error("set JOULESCHED_K8S_BIN_DIR to the directory holding kube-apiserver")
    if args.connections < 1 or args.rounds < 1:
        p.error("--connections and --rounds must be 1 or more")
    preload()
    cp = ControlPlane(Path(bin_dir), Path(tempfile.mkdtemp(prefix="joulesched-api-connection-cost-")))
    cp.start()
    try:
        conns = ApiConnections(api_client(str(cp.kubeconfig)).configuration, 5.0)
        request = f"GET /version HTTP/1.1\r\nHost: {conns.authority}\r\n\r\n".encode()

        def ask(s: ssl.SSLSocket) -> None:
            s.sendall(request)
            if not s.recv(65536):
                raise SystemExit("kube-apiserver closed the connection")

        def opened(ctx: ssl.SSLContext, session: ssl.SSLSession | None = None) -> ssl.SSLSocket:
            raw = socket.create_connection(conns.address, 5)
            return ctx.wrap_socket(raw, server_hostname=conns.server_hostname, session=session)

        def median_ms(what: Callable[[], object]) -> float:
            spent = []
            for _ in range(args.connections):
                started = time.thread_time()
                what()
                spent.append(time.thread_time() - started)
            return 1e3 * statistics.median(spent)

        def new_context() -> None:
            with opened(conns._new_context()) as s:
                ask(s)

        shared = conns._new_context()

        def shared_context() -> None:
            with opened(shared) as s:
                ask(s)

        last: list[ssl.SSLSession | None] = [None]
        reused = [0]

        def resumed() -> None:
            with opened(shared, last[0]) as s:
                ask(s)
                reused[0] += s.session_reused
                last[0] = s.session

        for r in range(args.rounds):
            reused[0] = 0
            with opened(shared) as s:
                ask(s)
                version = s.version()
                figures = {
                    "context": median_ms(conns._new_context),
                    "new context": median_ms(new_context),
                    "shared context": median_ms(shared_context),
                    "resumed": median_ms(resumed),
                    "open": median_ms(lambda: ask(s)),
                }
            shown = ", ".join(f"{name} {ms:.3f}" for name, ms in figures.items())
            print(f"round {r + 1} ({version}; {reused[0]} of {args.connections} resumed): ms of CPU: {shown}", flush=True)
    finally:
        cp.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
