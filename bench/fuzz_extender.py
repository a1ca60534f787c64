"""Send fuzzed requests to a running extender over one kept-alive connection and count failures.

Starts ``joulesched extender`` on loopback (or drives ``--url``, which must be loopback) and
sends ``--requests`` bodies built by mutating the golden requests kube-scheduler sent
(``tests/e2e/testdata``) across every verb: numbers replaced by infinities, NaN, huge and
negative values, quantity strings that overflow or are very long, deep nesting, bad UTF-8,
truncated bodies, wrong types. It counts HTTP 500s, replies that are not JSON, replies slower
than 1 s and connection errors; any of them is a failure (exit status 1).

    python bench/fuzz_extender.py --requests 20000 --seed 1
"""

from __future__ import annotations

import argparse
import copy
import http.client
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import yaml

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "e2e" / "testdata"
VERBS = ("filter", "prioritize", "explain", "preempt", "bind")
SLOW_SECONDS = 1.0
LOOPBACK = {"127.0.0.1", "localhost", "::1"}

RAW_NUMBERS = ["1e309", "-1e309", "1e400", "NaN", "Infinity", "-Infinity", "18446744073709551616", "1e-400", "-0", "9" * 400]
QUANTITIES = [
    "1e309", "1e1000000", "-1e1000000", "1e30", "2e6", "inf", "nan", "NaN", "-1", "1Ei", "9999999Pi", "1e-1000000",
    "1" * 8000 + "x", "1" * 100_000, "." + "1" * 5000 + "e", "1e", "0x10", "1\n", "\u0661", "500m", "",
]
STRINGS = ["x\nERROR forged", "\x1b[31mred", "\u2028", "a" * 10_000, "\ufffe", "", " ", "../../etc/passwd"]


def golden_requests() -> dict[str, list[Any]]:
    docs: list[Any] = [orjson.loads(p.read_bytes()) for p in sorted(GOLDEN.glob("extender_*_args_*.json"))]
    pods = [d["Pod"] for d in docs if isinstance(d, dict) and "Pod" in d]
    names = sorted(node_names(docs))
    preempt = [{"Pod": pod, "NodeNameToMetaVictims": {n: {"Pods": [{"UID": "victim"}], "NumPDBViolations": 0} for n in names}} for pod in pods]
    bind = [{"PodName": "p", "PodNamespace": "default", "PodUID": "uid", "Node": names[0] if names else "n"}]
    return {"filter": docs, "prioritize": docs, "explain": docs, "preempt": preempt, "bind": bind}


def node_names(docs: list[Any]) -> set[str]:
    names: set[str] = set()
    for d in docs:
        names.update(n for n in d.get("NodeNames") or [] if isinstance(n, str))
        for item in (d.get("Nodes") or {}).get("items") or []:
            names.add(item["metadata"]["name"])
    return names


def deep(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


class Mutator:
    """Builds one hostile body from a golden document (raw JSON where orjson cannot write it)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def paths(self, doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        out = [prefix]
        if isinstance(doc, dict):
            for k, v in doc.items():
                out += self.paths(v, (*prefix, k))
        elif isinstance(doc, list):
            for i, v in enumerate(doc):
                out += self.paths(v, (*prefix, i))
        return out

    def value(self) -> tuple[Any, str | None]:
        """A replacement value, or a sentinel with the raw JSON text it stands for."""
        r = self.rng
        kind = r.randrange(8)
        if kind == 0:
            return None, r.choice(RAW_NUMBERS)
        if kind == 1:
            return r.choice(QUANTITIES), None
        if kind == 2:
            return None, deep(r.choice([64, 254, 256, 300, 1000, 1100]))
        if kind == 3:
            return r.choice(STRINGS), None
        if kind == 4:
            return r.choice([None, True, False, [], {}, [1, "a"], {"x": None}, 0, -1, 2**63 - 1, 1.5e300]), None
        if kind == 5:
            return r.uniform(-1e6, 1e6), None
        if kind == 6:
            return {"cpu": r.choice(QUANTITIES), "nvidia.com/gpu": r.choice(QUANTITIES)}, None
        return [r.choice(STRINGS) for _ in range(r.randrange(1, 5))], None

    def body(self, doc: Any) -> bytes:
        r = self.rng
        doc = copy.deepcopy(doc)
        raws: dict[str, str] = {}
        for _ in range(r.randrange(1, 4)):
            if r.random() < 0.4:  # aim at the resource requests, where the numbers are
                spec = doc.get("Pod", {}).get("spec", {}) if isinstance(doc, dict) and isinstance(doc.get("Pod"), dict) else {}
                containers = spec.get("containers") if isinstance(spec, dict) else None
                if isinstance(containers, list) and containers and isinstance(containers[0], dict):
                    resources = containers[0].setdefault("resources", {})
                    requests = resources.setdefault("requests", {}) if isinstance(resources, dict) else None
                    if isinstance(requests, dict):
                        value, raw = self.value() if r.random() < 0.3 else (r.choice(QUANTITIES), None)
                        key = r.choice(["cpu", "memory", "nvidia.com/gpu"])
                        requests[key] = self._sentinel(value, raw, raws)
                        continue
            path = r.choice(self.paths(doc))
            value, raw = self.value()
            doc = self._set(doc, path, self._sentinel(value, raw, raws))
        text = orjson.dumps(doc)
        for token, raw in raws.items():
            text = text.replace(orjson.dumps(token), raw.encode())
        return self._bytes(text)

    def _sentinel(self, value: Any, raw: str | None, raws: dict[str, str]) -> Any:
        if raw is None:
            return value
        token = f"@@raw{len(raws)}@@"
        raws[token] = raw
        return token

    def _set(self, doc: Any, path: tuple[Any, ...], value: Any) -> Any:
        if not path:
            return value
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
        return doc

    def _bytes(self, text: bytes) -> bytes:
        r = self.rng
        roll = r.random()
        if roll < 0.05:
            return text[: r.randrange(len(text) + 1)]  # truncated
        if roll < 0.10:
            i = r.randrange(len(text) + 1)
            return text[:i] + r.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"]) + text[i:]  # bad UTF-8
        if roll < 0.12:
            return b""
        if roll < 0.14:
            data = bytearray(text)
            for _ in range(r.randrange(1, 8)):
                data[r.randrange(len(data))] = r.randrange(256)
            return bytes(data)
        return text


def start_extender(names: set[str], workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    from joulesched.extender.bench import profile_document
    from joulesched.extender.demo import free_port, wait_ready

    profiles = profile_document(len(names))
    for node, name in zip(profiles["nodes"], sorted(names), strict=True):
        node["name"] = name
    (workdir / "nodes.yaml").write_text(yaml.safe_dump(profiles))
    (workdir / "config.yaml").write_text(yaml.safe_dump({"profiles": {"file": {"path": str(workdir / "nodes.yaml")}}}))
    port = free_port()
    log = (workdir / "extender.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "joulesched", "extender", "--config", str(workdir / "config.yaml"),
         "--listen", f"127.0.0.1:{port}", "--workers", "2"],
        stdout=log, stderr=log, cwd=ROOT,
    )
    wait_ready(port, proc)
    return proc, port


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=100_000, help="fuzzed requests to send")
    p.add_argument("--url", help="a running extender on loopback (default: start one)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-seconds", type=float, default=1800.0, help="stop after this long whatever the count")
    p.add_argument("--out", help="also write the counts as JSON here")
    a = p.parse_args(argv)
    if a.requests < 1 or a.requests > 10_000_000:
        p.error("--requests: 1 to 10,000,000")
    golden = golden_requests()
    proc = None
    workdir = Path(tempfile.mkdtemp(prefix="joulesched-fuzz-"))
    if a.url:
        url = urlsplit(a.url)
        if url.hostname not in LOOPBACK:
            p.error("--url: loopback only (127.0.0.1, localhost, ::1)")
        host, port = url.hostname or "127.0.0.1", url.port or 80
    else:
        proc, port = start_extender(node_names(golden["filter"]), workdir)
        host = "127.0.0.1"
    rng = random.Random(a.seed)
    mutator = Mutator(rng)
    counts: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    slowest = 0.0
    examples: dict[str, str] = {}
    conn = http.client.HTTPConnection(host, port, timeout=30)
    started = time.monotonic()
    sent = 0
    try:
        while sent < a.requests and time.monotonic() - started < a.max_seconds:
            verb = rng.choice(VERBS)
            body = mutator.body(rng.choice(golden[verb]))
            sent += 1
            t0 = time.perf_counter()
            try:
                conn.request("POST", f"/scheduler/{verb}", body=body, headers={"Content-Type": "application/json"})
                reply = conn.getresponse()
                data = reply.read()
            except (OSError, http.client.HTTPException) as err:
                counts["connection_errors"] += 1
                examples.setdefault("connection_error", f"{verb}: {err!r}: {body[:200]!r}")
                conn.close()
                conn = http.client.HTTPConnection(host, port, timeout=30)
                continue
            elapsed = time.perf_counter() - t0
            slowest = max(slowest, elapsed)
            statuses[reply.status] += 1
            if elapsed > SLOW_SECONDS:
                counts["slow_replies"] += 1
                examples.setdefault("slow", f"{verb} {elapsed:.2f}s: {body[:200]!r}")
            if reply.status >= 500:
                counts["http_500"] += 1
                examples.setdefault("http_500", f"{verb}: {data[:300]!r} <- {body[:300]!r}")
            try:
                orjson.loads(data)
            except orjson.JSONDecodeError:
                counts["non_json"] += 1
                examples.setdefault("non_json", f"{verb} {reply.status}: {data[:200]!r}")
    finally:
        conn.close()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=20)
    seconds = time.monotonic() - started
    result = {
        "requests": sent,
        "seconds": round(seconds, 1),
        "statuses": dict(sorted(statuses.items())),
        "http_500": counts["http_500"],
        "non_json": counts["non_json"],
        "slow_replies_over_1s": counts["slow_replies"],
        "connection_errors": counts["connection_errors"],
        "slowest_ms": round(slowest * 1000, 1),
        "examples": examples,
    }
    print(json.dumps(result, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2))
    failures = counts["http_500"] + counts["non_json"] + counts["slow_replies"] + counts["connection_errors"]
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
