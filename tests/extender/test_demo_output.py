"""``joulesched extender --demo`` as a user meets it: a profile set that is not ready says why at
once, the table keeps its columns for long node names, and a reader that stops early (``| head``)
gets no traceback."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from joulesched.extender import cli
from joulesched.extender.demo import wait_ready

CURVE = "[50, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170]"


class Alive:
    """A child process that never exits (what wait_ready polls)."""

    returncode = None

    def poll(self) -> None:
        return None


@pytest.fixture
def not_ready_server() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"not ready: 1 node profiles from file, 1 stale (measured over 120 s ago), read 0 s ago\n"
            self.send_response(503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_wait_ready_says_what_readyz_answered_when_it_gives_up(not_ready_server: int) -> None:
    with pytest.raises(RuntimeError) as caught:
        wait_ready(not_ready_server, Alive(), timeout=0.5)  # type: ignore[arg-type]
    assert str(caught.value) == (
        f"the extender on port {not_ready_server} was not ready after 0 s; GET /readyz answered 503: "
        "not ready: 1 node profiles from file, 1 stale (measured over 120 s ago), read 0 s ago"
    )


def test_the_demo_on_stale_profiles_says_why_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the `updated` of policy/profile.py's example as it was: long past, so every node is stale
    (tmp_path / "nodes.yaml").write_text(f"nodes:\n  - {{name: a, cores: 8, updated: 1764400000.0, power_curve_watts: {CURVE}}}\n")
    (tmp_path / "c.yaml").write_text("profiles: {file: {path: nodes.yaml}}\n", encoding="utf-8")
    started = time.monotonic()
    assert cli.main(["--demo", "--config", str(tmp_path / "c.yaml")]) == 1
    assert time.monotonic() - started < 25  # it waited the whole 30 s before
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (
        "joulesched extender --demo: the extender is not ready, GET /readyz answered 503: not ready: 1 node profiles"
        " from file, 1 stale (measured over 120 s ago), read 0 s ago (a profile whose `updated` time is older than"
        " policy.max_age_seconds is stale; leave `updated` out of a static profile: docs/configuration.md, \"Node profiles\")"
    )


LONG = "gpu-h100-sxm5-rack17-slot04"  # 27 characters


def demo(tmp_path: Path, **kw: object) -> subprocess.Popen[str]:
    (tmp_path / "nodes.yaml").write_text(
        "sites:\n  s: {pue: 1.2, carbon_intensity: 100}\nnodes:\n"
        f"  - {{name: a, site: s, cores: 16, power_curve_watts: {CURVE}}}\n"
        f"  - {{name: {LONG}, site: s, cores: 64, power_curve_watts: {CURVE}}}\n",
        encoding="utf-8",
    )
    (tmp_path / "c.yaml").write_text("profiles: {file: {path: nodes.yaml}}\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "joulesched", "extender", "--demo", "--config", str(tmp_path / "c.yaml")]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]


def test_the_node_column_is_as_wide_as_the_longest_name(tmp_path: Path) -> None:
    proc = demo(tmp_path)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("node "))
    header, rows = lines[head], lines[head + 1 : head + 3]
    assert sorted(r.split()[0] for r in rows) == sorted(["a", LONG])
    for column in ("score", "Δ watts", "energy kJ", "CO2e g"):
        end = header.index(column) + len(column)  # right-aligned: every row's value ends where its title does
        for row in rows:
            assert row[end - 1] != " " and (end == len(row) or row[end] == " "), (column, header, row)
    assert header.index("score") > len(LONG)


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    proc = demo(tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # as `| head -n 0` does: nobody reads what the demo prints
    with proc.stderr:
        err = proc.stderr.read()
    assert proc.wait(timeout=90) == 1  # its output went nowhere
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert err == ""
