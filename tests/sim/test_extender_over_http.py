"""``--extender-url auto``: a real extender per policy, placing every pod as the policy in process does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from joulesched.cli import main as joulesched
from joulesched.policy.config import PolicyConfig, parse_policy
from joulesched.policy.validate import Checker, settings_document

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "sim" / "data" / "clusters" / "example.yaml"
SMALL = ROOT / "sim" / "data" / "workflows" / "methylseq-dirt02-001.json"


def test_every_policy_setting_reads_back_from_its_document() -> None:
    given = PolicyConfig(
        strategy="carbon", band=0.25, neutral_score=3, max_age_seconds=60.0, reference_runtime_seconds=600.0,
        gpu_pod_utilisation=0.5, avoid_saturation=False, idle_power="autoscaled", score_scale="cluster",
        reserve_gpu_nodes=False, filter_keeps="best", power_cap_enabled=False, power_cap_headroom=0.1,
    )  # fmt: skip
    assert given != PolicyConfig()
    check = Checker("policy.yaml")
    assert parse_policy(settings_document(given), check) == given
    assert not check.problems


def test_the_extender_over_http_places_as_the_policy_in_process_with_a_relative_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A relative --out (the demo's default) once made the spawned extender look for its
    # profiles under its own folder twice; and settings the policy file changes from their
    # defaults were left out of the extender's config, so it placed pods otherwise.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "policy.yaml").write_text(
        "policy:\n  idle_power: autoscaled\n  score_scale: cluster\n  avoid_saturation: false\n  filter_keeps: best\n",
        encoding="utf-8",
    )
    common = ["sim", "run", "--trace", str(SMALL), "--cluster", str(EXAMPLE), "--policies", "energy",
              "--policy-config", "policy.yaml", "--no-plots", "--no-attribution"]  # fmt: skip
    assert joulesched([*common, "--out", "in-process"]) == 0
    assert joulesched([*common, "--out", "over-http", "--extender-url", "auto"]) == 0
    here, there = (json.loads(Path(d, "results.json").read_text(encoding="utf-8"))["policies"]["energy"] for d in ("in-process", "over-http"))
    for key in ("energy_joules", "carbon_grams", "makespan_seconds", "mean_pending_seconds", "pods"):
        assert there[key] == here[key], key
