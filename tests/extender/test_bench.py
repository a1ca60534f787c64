"""``joulesched bench`` runs end to end (a smoke test: the figures themselves are in docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from joulesched.extender import bench


@pytest.mark.slow
def test_the_benchmark_measures_both_servers_and_writes_its_figures(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "bench.json"
    assert bench.main(["--requests", "5", "--scenarios", "names:10,nodes:3", "--warmup-seconds", "0", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["connections"] == 1 and doc["meta"]["workers"] == 2
    rows = {(r["mode"], r["nodes"], r["verb"]) for r in doc["results"]}
    assert rows == {(m, n, v) for m, n in (("names", 10), ("nodes", 3)) for v in ("prioritize", "filter")}
    for row in doc["results"]:
        for server in ("joulesched", "floor"):
            figures = row[server]
            assert 0 < figures["p50_ms"] <= figures["p99_ms"] and figures["requests_per_second"] > 0
    assert "p99 ratio" in capsys.readouterr().out
