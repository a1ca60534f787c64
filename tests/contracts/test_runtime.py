"""joulesched_build_info and --log-format, on the real extender (gunicorn) and the real agent."""

from __future__ import annotations

import io
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from joulesched.contracts import names, runtime
from joulesched.contracts.net import free_port
from joulesched.extender.demo import wait_ready
from tests.extender.support import PROFILES
from tests.measurement.agent_server_support import start
from tests.measurement.fakes import FakeClock
from tests.measurement.replica import PowercapTree, ProcTree

ROOT = Path(__file__).resolve().parents[2]


def build_info(text: str) -> list[dict[str, str]]:
    fams = [f for f in text_string_to_metric_families(text) if f.name == names.BUILD_INFO.name]
    assert len(fams) == 1, text[-2000:]
    assert fams[0].type == "gauge"
    assert [s.value for s in fams[0].samples] == [1.0]
    return [s.labels for s in fams[0].samples]


def json_lines(text: str) -> list[dict[str, str]]:
    out = []
    for line in text.splitlines():
        doc = json.loads(line)  # every line, not only some: a stray text line fails here
        assert set(doc) >= {"ts", "level", "logger", "msg"}, doc
        assert doc["ts"].endswith("Z") and doc["ts"][10] == "T", doc
        out.append(doc)
    return out


def test_json_formatter_writes_one_object_per_record_with_the_traceback() -> None:
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    for h in saved:  # the test runner's own handlers: setup_logging leaves a configured root alone
        root.removeHandler(h)
    stream = io.StringIO()
    try:
        handler = runtime.setup_logging("info", "json", stream=stream)
        assert handler is not None and root.handlers == [handler]
        log = logging.getLogger("joulesched.test")
        log.info("two\nlines %s", "é")
        log.debug("not shown")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
        again = runtime.setup_logging("info", "json", stream=stream)
        assert root.handlers == [again], "a second call replaces our handler, it does not add one"
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)
    docs = json_lines(stream.getvalue())
    assert [(d["level"], d["logger"], d["msg"]) for d in docs] == [
        ("info", "joulesched.test", "two\nlines é"),
        ("error", "joulesched.test", "failed"),
    ]
    assert "ValueError: boom" in docs[1]["exc"]


def test_a_configured_root_logger_is_left_alone() -> None:
    root = logging.getLogger()
    foreign = logging.NullHandler()
    root.addHandler(foreign)
    try:
        before = list(root.handlers)
        assert runtime.setup_logging("info", "json", stream=io.StringIO()) is None
        assert root.handlers == before
    finally:
        root.removeHandler(foreign)


def test_an_unknown_log_format_is_refused() -> None:
    with pytest.raises(ValueError, match="text, json"):
        runtime.formatter("xml")


def test_build_labels_name_version_revision_and_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runtime.REVISION_ENV, "0123456789ab")
    labels = runtime.build_labels()
    assert labels == {
        "version": runtime.version(),
        "revision": "0123456789ab",
        "python_version": platform.python_version(),
    }
    monkeypatch.delenv(runtime.REVISION_ENV)
    assert runtime.build_labels()["revision"] == "unknown"
    assert tuple(labels) == names.BUILD_INFO.labels


def test_the_extender_logs_json_gunicorn_lines_too_and_exports_build_info(tmp_path: Path) -> None:
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump(PROFILES))
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump({"profiles": {"file": {"path": "nodes.yaml"}}, "server": {"workers": 2}})
    )
    port = free_port()
    env = {**os.environ, runtime.REVISION_ENV: "feedc0de"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the command sets its own, as in the image
    cmd = [sys.executable, "-m", "joulesched", "extender", "--config", str(tmp_path / "config.yaml"),
           "--listen", f"127.0.0.1:{port}", "--log-format", "json"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_ready(port, proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    labels = build_info(text)
    assert labels == [
        {"version": runtime.version(), "revision": "feedc0de", "python_version": platform.python_version()}
    ]
    docs = json_lines(err)
    loggers = {d["logger"] for d in docs}
    assert "gunicorn.error" in loggers, err  # gunicorn's own start, worker and shutdown lines
    assert any("Listening at" in d["msg"] for d in docs), err
    assert any(d["msg"].startswith("Booting worker") for d in docs), err
    assert out == ""


def test_the_agent_logs_json_and_exports_build_info(tmp_path: Path) -> None:
    running = start(tmp_path / "node", FakeClock())
    try:
        running.step()
        running.step()
        with urllib.request.urlopen(running.url + "/metrics", timeout=5) as reply:
            text = reply.read().decode()
    finally:
        running.server.shutdown()
        running.server.server_close()
    (labels,) = build_info(text)
    assert labels["version"] == runtime.version() and labels["python_version"] == platform.python_version()

    # The command: its log lines, as the DaemonSet runs it with --log-format json.
    sysfs, proc = tmp_path / "cli" / "sys", tmp_path / "cli" / "proc"
    PowercapTree(sysfs).add("intel-rapl:0", "package-0")
    ProcTree(proc, cpus=2)
    (tmp_path / "cli" / "cgroup").mkdir()
    port = free_port()
    cmd = [sys.executable, "-m", "joulesched", "agent", "--log-format", "json", f"--sysfs-root={sysfs}",
           f"--procfs-root={proc}", f"--cgroup-root={tmp_path / 'cli' / 'cgroup'}", "--node-name=n1",
           f"--listen=127.0.0.1:{port}"]  # fmt: skip
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except OSError:
                if agent.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the agent did not start: {agent.communicate(timeout=5)}")
                time.sleep(0.2)
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=30)
    docs = json_lines(err)
    assert docs and all(d["logger"].startswith("joulesched") for d in docs), err


def test_the_extender_command_imports_no_prometheus_client_before_it_sets_the_multiprocess_dir() -> None:
    # prometheus-client picks its value class on first import: imported before
    # PROMETHEUS_MULTIPROC_DIR is set, the gunicorn workers' counters would vanish from /metrics.
    code = "import sys, joulesched.extender.cli; print('prometheus_client' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.stdout.strip() == "False", done.stdout + done.stderr
