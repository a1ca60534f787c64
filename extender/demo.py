"""``joulesched extender --demo``: the extender end to end on this machine, in a few seconds.

Starts ``joulesched extender`` (gunicorn, the real server) on a free loopback port, sends an
example pod through filter, prioritize and explain over one kept-alive HTTP connection — as
kube-scheduler does — prints what it answered, and stops the server.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import IO, Any

import orjson

from joulesched.contracts.net import free_port as free_port  # re-exported: extender/bench.py and tests use it from here

EXAMPLE_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "align-reads-7f9c", "namespace": "genomics", "uid": "5d1e6a3c-0000-4000-8000-000000000001"},
    "spec": {
        "schedulerName": "joulesched",
        "containers": [{"name": "bwa", "image": "example/bwa:0.7", "resources": {"requests": {"cpu": "8", "memory": "16Gi"}}}],
    },
}


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0, path: str = "/readyz") -> None:
    """Until ``GET path`` answers 200 (``/healthz``: the workers serve, whatever the profiles)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the extender exited with code {proc.returncode} before it was ready")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.1)
    raise RuntimeError(f"the extender on port {port} was not ready after {timeout:.0f} s")


def start_extender(
    config: str | os.PathLike[str], port: int, log_path: str | os.PathLike[str], *extra: str, checkout: str | None = None
) -> subprocess.Popen[bytes]:
    """``joulesched extender --config CONFIG`` on 127.0.0.1:PORT in a child process, logging to ``log_path``.

    A fresh metrics directory each time (``PROMETHEUS_MULTIPROC_DIR`` is not inherited);
    ``checkout`` runs another checkout's code (benchmarks' A/B runs).
    """
    env = dict(os.environ)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if checkout is not None:
        env["PYTHONPATH"] = checkout
    cmd = [sys.executable, "-m", "joulesched", "extender", "--config", str(config), "--listen", f"127.0.0.1:{port}", *extra]
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=log, env=env, cwd=checkout)


def stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM (gunicorn's graceful stop), SIGKILL after ``timeout``."""
    proc.terminate()
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def run_demo(config_path: str | None, prefix: str = "/scheduler", names: Sequence[str] | None = None) -> int:
    """Serve ``config_path`` (None: the defaults) and score the example pod on ``names`` (None:
    the shipped example's nodes) through the verbs under ``prefix``."""
    port = free_port()
    cmd = [sys.executable, "-m", "joulesched", "extender", "--listen", f"127.0.0.1:{port}", "--workers", "1"]
    if config_path:
        cmd += ["--config", config_path]
    nodes = list(names) if names is not None else _example_names()
    verbs = prefix.rstrip("/")
    # The child's stderr goes to a file, not a pipe: nobody reads it while it runs (a full pipe
    # would stop it), and it is shown when the child fails.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ})
        try:
            wait_ready(port, proc)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

            def post(verb: str, body: dict[str, Any]) -> Any:
                conn.request("POST", f"{verbs}/{verb}", orjson.dumps(body), {"Content-Type": "application/json"})
                reply = conn.getresponse()
                data = reply.read()
                if reply.status != 200:
                    raise RuntimeError(f"{verbs}/{verb}: HTTP {reply.status}: {data.decode(errors='replace')}")
                return orjson.loads(data)

            conn.request("GET", "/readyz")
            ready = conn.getresponse().read().decode().strip()
            args = {"Pod": EXAMPLE_POD, "NodeNames": nodes}
            filtered = post("filter", args)
            scores = post("prioritize", args)
            explain = post("explain", args)
            conn.close()
        except (RuntimeError, OSError, http.client.HTTPException) as err:
            print(f"joulesched extender --demo: {err}", file=sys.stderr)
            _show_child_stderr(proc, log)
            return 1
        finally:
            stop(proc, 15)
    print(f"extender on 127.0.0.1:{port} — {ready}")
    demand = explain["demand"]
    print(
        f"pod {explain['pod']['namespace']}/{explain['pod']['name']}: {demand['cpu_cores']:g} cores, "
        f"strategy {explain['policy']['strategy']}, runtime {demand['runtime_seconds']:.0f} s (reference)"
    )
    passed = set(filtered["NodeNames"])
    print(f"\n{'node':<14}{'score':>6}{'Δ watts':>10}{'energy kJ':>11}{'CO2e g':>9}  filter")
    by_host = {e["node"]: e for e in explain["nodes"]}
    for hp in sorted(scores, key=lambda h: -h["Score"]):
        e = by_host[hp["Host"]].get("estimate", {})
        verdict = "pass" if hp["Host"] in passed else filtered["FailedAndUnresolvableNodes"].get(hp["Host"], "fail")
        print(
            f"{hp['Host']:<14}{hp['Score']:>6}{e.get('marginal_watts', 0):>10.1f}"
            f"{(e.get('energy_joules') or 0) / 1000:>11.1f}{e.get('carbon_grams') or 0:>9.1f}  {verdict}"
        )
    print("\nprioritize answered (the exact JSON kube-scheduler reads):")
    print(orjson.dumps(scores).decode())
    return 0


def _example_names() -> list[str]:
    """The nodes of the shipped example (what the extender serves with no config)."""
    from joulesched.extender.config import example_profiles_path
    from joulesched.extender.profiles import read_profile_file

    return [n.name for n in read_profile_file(example_profiles_path()).nodes]


def _show_child_stderr(proc: subprocess.Popen[bytes], log: IO[bytes], lines: int = 40) -> None:
    """What the extender said on stderr (its last ``lines`` lines), once it has stopped."""
    stop(proc, 15)
    log.seek(0)
    said = log.read().decode("utf-8", errors="replace").rstrip().splitlines()
    if said:
        shown = said[-lines:]
        head = "the extender said" + (f" (its last {lines} lines)" if len(said) > lines else "") + ":"
        print("\n".join([head, *shown]), file=sys.stderr)
