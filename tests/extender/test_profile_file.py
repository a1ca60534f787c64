"""The ``file`` profile source: what a bad or emptied file does at start and while it runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from joulesched.extender.profiles import FileSource
from joulesched.policy.errors import ConfigError
from tests.extender.support import CURVE

GOOD = f"nodes:\n  - {{name: mine-1, cores: 64, power_curve_watts: {list(CURVE)}}}\n"


@pytest.mark.parametrize("text", ["", "nodes: []\n", "sites: {}\n"], ids=["empty", "no nodes listed", "sites only"])
def test_a_profile_file_without_nodes_is_refused_at_start(tmp_path: Path, text: str) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        FileSource(str(path))
    assert caught.value.problems == ["nodes: none given (a profile file names at least one node)"]


@pytest.mark.parametrize("text", ["", "nodes: []\n"], ids=["truncated", "emptied"])
def test_a_profile_file_emptied_while_running_keeps_the_last_good_profiles(tmp_path: Path, text: str) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text(GOOD, encoding="utf-8")
    now = [1000.0]
    source = FileSource(str(path), reload_seconds=1.0, clock=lambda: now[0])
    assert [p.name for p in source.snapshot().profiles.nodes] == ["mine-1"]
    path.write_text(text, encoding="utf-8")  # as a writer that truncates before it writes
    os.utime(path, ns=(0, 10**18))
    now[0] += 2.0
    snap = source.snapshot()
    assert [p.name for p in snap.profiles.nodes] == ["mine-1"] and source.errors == 1
    assert "none given" in (snap.error or "")
    path.write_text(GOOD.replace("mine-1", "mine-2"), encoding="utf-8")
    os.utime(path, ns=(0, 2 * 10**18))
    now[0] += 2.0
    snap = source.snapshot()
    assert [p.name for p in snap.profiles.nodes] == ["mine-2"] and not snap.error


def test_a_profile_file_that_breaks_with_no_pod_to_schedule_is_counted_at_readyz(tmp_path: Path) -> None:
    # The kubelet's readiness probes keep asking while kube-scheduler sends nothing: the failed
    # refresh they see is in the error counter at the next scrape, not only after a verb.
    from prometheus_client import CollectorRegistry

    from joulesched.extender.app import create_app
    from joulesched.extender.config import parse_config
    from joulesched.extender.metrics import ExtenderMetrics

    path = tmp_path / "nodes.yaml"
    path.write_text(GOOD, encoding="utf-8")
    now = [1000.0]
    config = parse_config({"profiles": {"file": {"path": str(path), "reload_seconds": 1e-6}}}, "test")
    app = create_app(config, metrics=ExtenderMetrics(CollectorRegistry()), clock=lambda: now[0], background=False)
    client = app.test_client()
    counter = 'joulesched_extender_profile_source_errors_total{source="file"} '
    assert client.get("/readyz").status_code == 200
    path.write_text("nodes: [", encoding="utf-8")
    os.utime(path, ns=(0, 10**18))
    now[0] += 2.0
    reply = client.get("/readyz")
    assert reply.status_code == 200 and b"the last refresh failed" in reply.data  # the last good profiles serve
    (line,) = [ln for ln in client.get("/metrics").get_data(as_text=True).splitlines() if ln.startswith(counter)]
    assert float(line.removeprefix(counter)) >= 1.0  # each refresh due that fails (here every read: reload 1 µs)


def test_a_node_field_given_twice_is_a_problem_naming_it_not_the_last_value_silently(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text(f"nodes:\n  - name: mine-1\n    cores: 64\n    cores: 8\n    power_curve_watts: {list(CURVE)}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        FileSource(str(path))
    assert caught.value.problems == ["nodes[0].cores: given twice in one mapping, at line 3 and again at line 4 (a key appears once)"]
