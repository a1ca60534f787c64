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
