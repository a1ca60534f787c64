"""``joulesched bench`` runs end to end (a smoke test: the figures themselves are in docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from joulesched.extender import bench


@pytest.mark.slow
def test_the_benchmark_measures_both_servers_and_writes_its_figures(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    blocks = []
    drive_in_turn = bench.drive_in_turn
    monkeypatch.setattr(bench, "drive_in_turn", lambda *a: blocks.append(a[-1]) or drive_in_turn(*a))
    out = tmp_path / "bench.json"
    argv = ["--requests", "5", "--scenarios", "names:10,nodes:3", "--warmup-seconds", "0", "--block-pods", "2"]
    assert bench.main([*argv, "--out", str(out)]) == 0
    assert blocks == [2, 2]  # each scenario driven in blocks of --block-pods
    doc = json.loads(out.read_text())
    assert doc["meta"]["connections"] == 1 and doc["meta"]["workers"] == 2 and doc["meta"]["in_turn_block_pods"] == 2
    rows = {(r["mode"], r["nodes"], r["verb"]) for r in doc["results"]}
    assert rows == {(m, n, v) for m, n in (("names", 10), ("nodes", 3)) for v in ("prioritize", "filter")}
    for row in doc["results"]:
        for server in ("joulesched", "floor"):
            figures = row[server]
            assert 0 < figures["p50_ms"] <= figures["p99_ms"] and figures["requests_per_second"] > 0
    assert "p99 ratio" in capsys.readouterr().out


def test_one_client_drives_the_servers_in_turn_so_both_see_the_same_moments() -> None:
    # Two floors that record which of them each pod reached, in arrival order.
    import http.server
    import threading

    seen: list[str] = []

    def serve(label: str) -> http.server.ThreadingHTTPServer:
        class Recording(bench.FloorHandler):
            def do_POST(self) -> None:
                if self.path.endswith("/filter"):
                    seen.append(label)
                super().do_POST()

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recording)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    servers = {"a": serve("a"), "b": serve("b")}
    try:
        body = bench.request_body("names", 4)
        ports = {k: s.server_address[1] for k, s in servers.items()}
        latencies = bench.drive_in_turn(ports, body, 7, 2, 0.0, block_pods=3)
        # warm-up pod by pod, then blocks of 3 with the order reversed every block, the last one short
        assert "".join(seen) == "abab" + "aaabbb" + "bbbaaa" + "a" + "b"
        assert {k: [len(v[verb]) for verb in bench.VERBS] for k, v in latencies.items()} == {"a": [7, 7], "b": [7, 7]}
        # By default pod by pod, the order reversed every pod: a server waits at most two of
        # the other's pods, not a block of them (docs/benchmarks.md, "The first request after
        # an idle spell").
        seen.clear()
        bench.drive_in_turn(ports, body, 4, 2, 0.0)
        assert "".join(seen) == "abab" + "ab" + "ba" + "ab" + "ba"
    finally:
        for server in servers.values():
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--block-pods", "0"], "argument --block-pods: must be a whole number >= 1, got '0'"),
        (["--block-pods", "2", "--connections", "2"], "--block-pods is for one client (--connections 1)"),
    ],
)
def test_blocks_the_bench_cannot_drive_are_refused_by_name(capsys, argv, said) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_:
        bench.main(argv)
    assert exit_.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--scenarios", "names:abc"], "argument --scenarios: 'names:abc': the count must be a whole number, got 'abc'"),
        (["--scenarios", "bogus:10"], "argument --scenarios: 'bogus:10': must be MODE:COUNT with MODE names or nodes"),
        (["--scenarios", "names"], "argument --scenarios: 'names': must be MODE:COUNT with MODE names or nodes"),
        (["--scenarios", "nodes:0"], "argument --scenarios: 'nodes:0': the count must be 1 or more"),
        (["--requests", "-1"], "argument --requests: must be a whole number >= 1, got '-1'"),
        (["--requests", "0"], "argument --requests: must be a whole number >= 1, got '0'"),
        (["--connections", "0"], "argument --connections: must be a whole number >= 1, got '0'"),
        (["--workers", "0"], "argument --workers: must be a whole number >= 1, got '0'"),
        (["--workers", "65"], "argument --workers: must be <= 64, got 65 (the bounds of the extender's server.workers)"),
        (["--warmup-seconds", "nan"], "argument --warmup-seconds: must be a finite number >= 0 seconds, got 'nan'"),
        (["--warmup-seconds", "-1"], "argument --warmup-seconds: must be a finite number >= 0 seconds, got '-1'"),
    ],
)
def test_flags_the_bench_cannot_use_are_refused_before_it_starts(capsys, monkeypatch, argv, said) -> None:  # type: ignore[no-untyped-def]
    started = []
    monkeypatch.setattr(bench.subprocess, "Popen", lambda *a, **k: started.append(a) or pytest.fail("started"))
    with pytest.raises(SystemExit) as exit_:
        bench.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.strip().splitlines()[-1] == f"joulesched bench: error: {said}"
    assert "Traceback" not in err and started == []


def test_an_out_file_that_cannot_be_written_is_refused_before_measuring(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(bench.subprocess, "Popen", lambda *a, **k: pytest.fail("started"))
    for out, said in ((tmp_path / "nonexist" / "b.json", f"the folder {tmp_path / 'nonexist'} does not exist"), (tmp_path, f"{tmp_path} is a folder")):
        with pytest.raises(SystemExit) as exit_:
            bench.main(["--out", str(out)])
        assert exit_.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"joulesched bench: error: argument --out: {said}"
