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
    """Until ``GET path`` answers 200 (``/healthz``: the workers serve, whatever the profiles).

    Giving up, the error says what ``path`` last answered (``/readyz`` says why it is not ready).
    """
    deadline = time.monotonic() + timeout
    last = "never answered"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the extender exited with code {proc.returncode} before it was ready")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            conn.request("GET", path)
            reply = conn.getresponse()
            if reply.status == 200:
                return
            last = f"answered {reply.status}: {_one_line(reply.read())}"
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        time.sleep(0.1)
    raise RuntimeError(f"the extender on port {port} was not ready after {timeout:.0f} s; GET {path} {last}")


def _one_line(body: bytes, limit: int = 500) -> str:
    text = " ".join(body.decode("utf-8", errors="replace").split())
    return text if len(text) <= limit else text[:limit] + "…"


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
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # connects at its first request
        try:
            # The profile file is read before the workers serve and only ages after: once they
            # serve, /readyz says for good whether the demo's pod would be scored.
            wait_ready(port, proc, path="/healthz")
            conn.request("GET", "/readyz")
            reply = conn.getresponse()
            ready = _one_line(reply.read())
            if reply.status != 200:  # what the extender logged says nothing more
                print(
                    f"joulesched extender --demo: the extender is not ready, GET /readyz answered {reply.status}:"
                    f" {ready} (a profile whose `updated` time is older than policy.max_age_seconds is stale;"
                    " leave `updated` out of a static profile: docs/configuration.md, \"Node profiles\")",
                    file=sys.stderr,
                )
                return 1

            def post(verb: str, body: dict[str, Any]) -> Any:
                conn.request("POST", f"{verbs}/{verb}", orjson.dumps(body), {"Content-Type": "application/json"})
                reply = conn.getresponse()
                data = reply.read()
                if reply.status != 200:
                    raise RuntimeError(f"{verbs}/{verb}: HTTP {reply.status}: {data.decode(errors='replace')}")
                return orjson.loads(data)

            args = {"Pod": EXAMPLE_POD, "NodeNames": nodes}
            filtered = post("filter", args)
            scores = post("prioritize", args)
            explain = post("explain", args)
        except (RuntimeError, OSError, http.client.HTTPException) as err:
            print(f"joulesched extender --demo: {err}", file=sys.stderr)
            _show_child_stderr(proc, log)
            return 1
        finally:
            conn.close()
            stop(proc, 15)
    lines = [f"extender on 127.0.0.1:{port} — {ready}", *report_lines(filtered, scores, explain)]
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:  # the reader stopped reading (``| head``): nothing left to say
        # the interpreter flushes stdout again at exit: point it at /dev/null so that says nothing either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def report_lines(filtered: dict[str, Any], scores: list[dict[str, Any]], explain: dict[str, Any]) -> list[str]:
    """What the demo prints after its first line: the pod, a row a node, the prioritize reply.

    The node column is as wide as the longest name, so the numbers stay in their columns.
    """
    demand = explain["demand"]
    out = [
        f"pod {explain['pod']['namespace']}/{explain['pod']['name']}: {demand['cpu_cores']:g} cores, "
        f"strategy {explain['policy']['strategy']}, runtime {demand['runtime_seconds']:.0f} s (reference)"
    ]
    passed = set(filtered["NodeNames"])
    width = max([12, *(len(hp["Host"]) for hp in scores)]) + 2
    out.append(f"\n{'node':<{width}}{'score':>6}{'Δ watts':>10}{'energy kJ':>11}{'CO2e g':>9}  filter")
    by_host = {e["node"]: e for e in explain["nodes"]}
    for hp in sorted(scores, key=lambda h: -h["Score"]):
        e = by_host[hp["Host"]].get("estimate", {})
        verdict = "pass" if hp["Host"] in passed else filtered["FailedAndUnresolvableNodes"].get(hp["Host"], "fail")
        out.append(
            f"{hp['Host']:<{width}}{hp['Score']:>6}{e.get('marginal_watts', 0):>10.1f}"
            f"{(e.get('energy_joules') or 0) / 1000:>11.1f}{e.get('carbon_grams') or 0:>9.1f}  {verdict}"
        )
    out.append("\nprioritize answered (the exact JSON kube-scheduler reads):")
    out.append(orjson.dumps(scores).decode())
    return out


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
