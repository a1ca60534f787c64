"""``joulesched sim run --scheduler kube``: the simulator's scheduler model against the real one.

A generated trace (independent pods, varied cpu and memory requests) is replayed on ten
heterogeneous nodes (tests/sim/fixtures/kube-replay-cluster.yaml) by the real kube-scheduler
v1.37.2, once with the default profile and once with NodeResourcesFit MostAllocated. For every
pod the model scores the nodes from the real cluster state when the pod was created; the real
node must be the model's best on at least 99 % of the pods whose best is not tied.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from joulesched.cli import main as joulesched

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "tests" / "sim" / "fixtures" / "kube-replay-cluster.yaml"
PODS = 160
MOST_ALLOCATED = {
    "name": "NodeResourcesFit",
    "args": {
        "scoringStrategy": {
            "type": "MostAllocated",
            "resources": [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}],
        }
    },
}


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sim-kube") / "pods.csv"
    assert joulesched(["sim", "generate", "pods", "--count", str(PODS), "--cluster-cores", "216",
                       "--utilisation", "0.7", "--seed", "3", "--out", str(path)]) == 0
    return path


def sim_nodes(control_plane) -> list[str]:
    nodes = control_plane.core.list_node(label_selector="joulesched.io/sim-run").items
    return [n.metadata.name for n in nodes]


@pytest.mark.parametrize("profile", ["default", "most-allocated"])
def test_model_agrees_with_the_real_scheduler(control_plane, scheduler_factory, trace, tmp_path,
                                              capsys, profile):
    name = f"sim-{profile}-{uuid.uuid4().hex[:6]}"
    entry: dict = {"schedulerName": name}
    if profile == "most-allocated":
        entry["pluginConfig"] = [MOST_ALLOCATED]
    scheduler_factory({"profiles": [entry]}, name=name)
    out = tmp_path / "out"
    started = time.monotonic()
    code = joulesched(["sim", "run", "--scheduler", "kube", "--kubeconfig", str(control_plane.kubeconfig),
                       "--scheduler-name", name, "--scheduler-profile", profile, "--seed", "1",
                       "--trace", str(trace), "--cluster", str(CLUSTER), "--out", str(out)])
    wall = time.monotonic() - started
    printed = capsys.readouterr()
    assert code == 0, printed.err
    print(printed.out)
    agreement = json.loads((out / "results.json").read_text(encoding="utf-8"))["kube_agreement"]
    assert agreement["profile"] == profile and agreement["server_version"] == "v1.37.2"
    assert agreement["pods"] == PODS and agreement["never_placed"] == 0
    assert agreement["refused_by_real_scheduler"] == 0
    assert agreement["non_tied"] >= 0.5 * PODS, agreement
    assert agreement["agreement_percent"] >= 99.0, agreement["disagreement_list"]
    assert "agreements (not tied)" in printed.out
    rows = (out / "placements.csv").read_text(encoding="utf-8").splitlines()
    assert len(rows) == PODS + 1
    # everything it made is gone (the namespace may stay Terminating: no namespace controller)
    assert sim_nodes(control_plane) == []
    ns = agreement["namespace"]
    assert control_plane.core.list_namespaced_pod(ns).items == []
    assert wall < 40, wall


def test_a_scheduler_that_never_binds_is_a_clear_error(control_plane, trace, tmp_path, capsys):
    started = time.monotonic()
    code = joulesched(["sim", "run", "--scheduler", "kube", "--kubeconfig", str(control_plane.kubeconfig),
                       "--scheduler-name", "nobody-serves-this", "--bind-timeout", "2",
                       "--trace", str(trace), "--cluster", str(CLUSTER), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "/probe was not bound within 2 s by scheduler 'nobody-serves-this' at " + control_plane.server in err
    assert time.monotonic() - started < 15
    assert sim_nodes(control_plane) == []
