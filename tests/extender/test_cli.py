"""``joulesched extender``: ``--workers`` within server.workers' bounds, and ``--demo`` with a config
(its prefix, its profile file's nodes; what it cannot drive refused; the child's errors shown)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from joulesched.extender import cli
from joulesched.extender.demo import run_demo

NODES = """\
sites:
  s: {pue: 1.2, carbon_intensity: 100}
nodes:
  - {name: small-a, site: s, cores: 16, memory_bytes: 68719476736, utilisation: 0.2,
     power_curve_watts: [50, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170]}
  - {name: big-b, site: s, cores: 64, memory_bytes: 137438953472, utilisation: 0.5,
     power_curve_watts: [120, 200, 230, 260, 290, 320, 350, 380, 410, 440, 470]}
"""


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("value", "said"),
    [("200", "must be <= 64, got 200"), ("65", "must be <= 64, got 65"), ("0", "must be >= 1, got 0")],
)
def test_workers_out_of_server_workers_bounds_are_refused(
    value: str, said: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # main sets it when unset: keep it off this process
    monkeypatch.setattr(cli, "serve", lambda *a, **k: pytest.fail("served instead of refusing --workers"))
    last = usage_error(["--workers", value, "--listen", "127.0.0.1:1"], capsys)
    assert last == f"joulesched extender: error: argument --workers: {said} (the bounds of server.workers)"


@pytest.mark.parametrize("flag", [["--workers", "2"], ["--listen", "127.0.0.1:8888"]])
def test_demo_refuses_the_flags_it_would_ignore(flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    last = usage_error(["--demo", *flag], capsys)
    assert last.startswith(f"joulesched extender: error: argument {flag[0]}: not with --demo")


def test_demo_scores_the_nodes_of_the_configs_profile_file_under_its_prefix(tmp_path: Path) -> None:
    (tmp_path / "nodes.yaml").write_text(NODES, encoding="utf-8")
    (tmp_path / "c.yaml").write_text("prefix: /x\nprofiles: {file: {path: nodes.yaml}}\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "joulesched", "extender", "--demo", "--config", str(tmp_path / "c.yaml")],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    assert "2 node profiles from file" in result.stdout
    scores = orjson.loads(result.stdout.strip().splitlines()[-1])
    assert {h["Host"] for h in scores} == {"small-a", "big-b"}
    assert sorted(h["Score"] for h in scores) != [5, 5]  # scored, not the neutral score of unknown nodes
    assert "epyc" not in result.stdout


def test_demo_with_a_broken_profile_file_lists_its_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.yaml").write_text("nodes:\n  - {name: a, cores: 0, idle_watts: 10, watts_per_core: 1}\n")
    (tmp_path / "c.yaml").write_text("profiles: {file: {path: bad.yaml}}\n", encoding="utf-8")
    assert cli.main(["--demo", "--config", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "nodes[0].cores: must be > 0, got 0" in err and "before it was ready" not in err


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("profiles: {source: prometheus, prometheus: {url: 'http://127.0.0.1:9'}}\n", "profiles.source is prometheus"),
        ("server: {tls: {cert_file: c.pem, key_file: k.pem}}\n", "server.tls.cert_file is set"),
    ],
)
def test_demo_refuses_a_config_it_cannot_drive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, said: str
) -> None:
    for pem in ("c.pem", "k.pem"):
        (tmp_path / pem).write_text("", encoding="utf-8")  # the config names readable files; the demo never loads them
    (tmp_path / "c.yaml").write_text(config, encoding="utf-8")
    assert cli.main(["--demo", "--config", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"joulesched extender: --demo: {tmp_path / 'c.yaml'}: {said}")
    assert len(err.strip().splitlines()) == 1


def test_demo_shows_what_the_extender_said_when_it_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.yaml"  # the child reads the config itself: it exits 2 before serving
    assert run_demo(str(missing), names=["a"]) == 1
    err = capsys.readouterr().err
    assert "the extender exited with code 2 before it was ready" in err
    assert f"joulesched extender: {missing}: 1 problem" in err and "cannot read" in err


def test_bench_help_is_plain_text() -> None:
    # `joulesched bench` lives in extender/bench.py; its description was its docstring's RST
    done = subprocess.run([sys.executable, "-m", "joulesched", "bench", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    description = done.stdout.split("\n\n")[1]
    assert " ".join(description.split()) == (
        "Measure the extender's latency and throughput against a constant-score floor, on loopback."
    )
    assert "``" not in done.stdout
