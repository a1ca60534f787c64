"""``joulesched sim run --scheduler kube`` without a cluster: the agreement arithmetic, the model on
a given state (the same as the engine's), the objects it would create, and its error messages."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest

from joulesched.cli import main as joulesched
from joulesched.sim.cluster import load_cluster
from joulesched.sim.engine import Engine, EngineOptions, Profile
from joulesched.sim.kubereplay import (
    SIM_LABEL,
    KubeOptions,
    KubeReplay,
    Verdict,
    judge,
    node_status,
    pod_body,
    quantity_cpu,
    summarise,
)
from joulesched.sim.schedstate import PodNeeds, SchedulingState, needs_of
from tests.sim.support import pod, workload

FIXTURES = Path(__file__).with_name("fixtures")
CLUSTER = FIXTURES / "kube-replay-cluster.yaml"
PODS = FIXTURES / "pods.csv"


def mask(*values: int) -> np.ndarray:
    return np.array(values, dtype=bool)


def ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# -- agreement arithmetic ---------------------------------------------------------------------


def test_judge_a_single_best_node() -> None:
    v = judge(mask(1, 1, 1), ints(150, 170, 160), 1)
    assert v.top == (1,) and v.best == 170 and v.real_score == 170
    assert v.agree and not v.tied and v.feasible == 3
    v = judge(mask(1, 1, 1), ints(150, 170, 160), 2)
    assert not v.agree and v.real_score == 160


def test_judge_ignores_infeasible_nodes_and_reports_ties() -> None:
    # node 0 scores highest but does not fit: the best feasible score (160) is shared by 1 and 3
    v = judge(mask(0, 1, 1, 1), ints(190, 160, 120, 160), 3)
    assert v.top == (1, 3) and v.best == 160 and v.tied and v.agree
    # a real node the model thinks infeasible is a disagreement without a model score
    v = judge(mask(0, 1, 1, 1), ints(190, 160, 120, 160), 0)
    assert not v.agree and v.real_score is None


def test_judge_a_pod_the_real_scheduler_refused() -> None:
    v = judge(mask(1, 0), ints(100, 0), None)
    assert not v.agree and v.real is None and v.top == (0,)
    none = judge(mask(0, 0), ints(0, 0), None)
    assert none.top == () and none.best is None and none.feasible == 0


def test_summary_counts_agreement_among_the_non_tied_only() -> None:
    verdicts = [
        Verdict((0,), 180, 0, 180, 3),  # agrees
        Verdict((1,), 175, 1, 175, 1),  # agrees, only one node fitted
        Verdict((2,), 170, 0, 160, 3),  # disagrees
        Verdict((0, 1), 150, 1, 150, 3),  # tied, real among the best
        Verdict((0, 1), 150, 2, 140, 3),  # tied, real elsewhere: a disagreement, but not counted
        Verdict((2,), 120, None, None, 2),  # refused by the real scheduler
    ]
    s = summarise(verdicts)
    assert s["pods"] == 6
    assert s["non_tied"] == 4 and s["agreements"] == 2
    assert s["agreement_percent"] == pytest.approx(50.0)
    assert s["tied"] == 2 and s["tied_real_among_best"] == 1
    assert s["single_feasible"] == 1 and s["refused_by_real_scheduler"] == 1
    assert s["disagreements"] == 3
    assert summarise([])["agreement_percent"] is None


# -- the model on a state ---------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["least", "most"])
def test_the_replays_scores_are_the_engines(strategy: str) -> None:
    """The replay judges with the state and arithmetic the simulator schedules with."""
    cluster = load_cluster(CLUSTER)
    rng = np.random.default_rng(7)
    pods = [
        pod(f"p{i}", 60, cpu=float(rng.choice([0.0, 0.5, 1.0, 2.0, 3.5])), memory_request=float(rng.integers(0, 8)) * 2**29)
        for i in range(40)
    ]
    wl = workload(*pods)
    engine = Engine(cluster, wl, Profile("x", strategy), EngineOptions(record_timeseries=False))
    profile = "most-allocated" if strategy == "most" else "default"
    state = KubeReplay(cluster, wl, KubeOptions(profile=profile)).state
    assert type(state) is type(engine.sched) is SchedulingState
    assert state.fit_strategy == engine.sched.fit_strategy == strategy
    for p in pods[:30]:  # load the nodes the same way in both
        node = int(rng.integers(state.n))
        needs = needs_of(p)
        if not state.fits(needs)[node]:
            continue
        state.bind(needs, node)
        engine.sched.bind(needs, node)
    assert state.npods.sum() > 10
    for i in range(30, 40):
        needs = needs_of(pods[i])
        feasible = state.fits(needs)
        assert (feasible == engine._feasible(i)).all()
        cand = np.flatnonzero(feasible)
        assert (state.scores(needs, cand) == engine._total_scores(i, cand, None)).all()


def test_state_bind_and_unbind_are_inverse() -> None:
    state = SchedulingState(load_cluster(CLUSTER), "least", groups=1)
    needs = PodNeeds(1500, 2**30, 1, 0)
    before = state.fits(needs).copy()
    state.bind(needs, 8)
    assert state.req_cpu[8] == 1500 and state.group_host[0, 8] == 1 and state.npods[8] == 1
    assert state.free_cpu[8] == state.alloc_cpu[8] - 1500 and state.free_pods[8] == state.max_pods[8] - 1
    state.unbind(needs, 8)
    assert not state.req_cpu.any() and not state.group_host.any() and (state.fits(needs) == before).all()
    assert (state.free_cpu == state.alloc_cpu).all() and (state.free_pods == state.max_pods).all()
    # only the GPU node fits a GPU pod
    assert list(np.flatnonzero(state.fits(needs))) == [8]


def test_a_full_node_fails_the_filter_and_an_unknown_strategy_is_refused() -> None:
    state = SchedulingState(load_cluster(CLUSTER), "least")
    small = PodNeeds(100, 0, 0)
    state.bind(small, 0)
    for _ in range(int(state.max_pods[0]) - 1):
        state.bind(small, 0)
    assert not state.fits(small)[0] and state.fits(small)[1]
    with pytest.raises(ValueError, match="fit strategy"):
        SchedulingState(load_cluster(CLUSTER), "balanced")


# -- the objects ------------------------------------------------------------------------------


def test_quantities_and_pod_body() -> None:
    assert quantity_cpu(2000) == "2" and quantity_cpu(1500) == "1500m" and quantity_cpu(1) == "1m"
    body = pod_body("p1-x", "ns", "run1", "sched", PodNeeds(500, 2**30, 1, -1), "x")
    spec = body["spec"]
    assert spec["schedulerName"] == "sched" and spec["nodeSelector"] == {SIM_LABEL: "run1"}
    assert spec["containers"][0]["resources"] == {
        "requests": {"cpu": "500m", "memory": str(2**30), "nvidia.com/gpu": "1"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    assert spec["tolerations"] == [{"key": SIM_LABEL, "operator": "Equal", "value": "run1", "effect": "NoSchedule"}]
    assert "ownerReferences" not in body["metadata"] and body["metadata"]["annotations"]["joulesched.io/sim-pod"] == "x"
    best_effort = pod_body("p2", "ns", "run1", "sched", PodNeeds(0, 0, 0, -1), "y", group="Web Tier")
    assert "resources" not in best_effort["spec"]["containers"][0]
    assert best_effort["metadata"]["labels"]["joulesched.io/sim-group"] == "web-tier"


def test_node_status_has_allocatable_and_ready() -> None:
    status = node_status("n", 24000, 192 * 2**30, 110, 2)["status"]
    assert status["allocatable"] == {"cpu": "24", "memory": str(192 * 2**30), "pods": "110", "nvidia.com/gpu": "2"}
    assert status["capacity"] == status["allocatable"]
    assert status["conditions"][0]["type"] == "Ready" and status["conditions"][0]["status"] == "True"


def test_replay_names_are_valid_and_unique() -> None:
    cluster = load_cluster(CLUSTER)
    wl = workload(pod("Align_Sample (1)", 10), pod("Align_Sample (1)", 10))
    r = KubeReplay(cluster, wl, KubeOptions(run_id="ABC"))
    assert r.namespace == "joulesched-sim-abc"
    assert r.k8s_nodes[0] == "jsim-abc-small-000"
    assert [p.k8s_name for p in r.placements] == ["p0-align-sample-1", "p1-align-sample-1"]


# -- errors a user can act on -----------------------------------------------------------------


def run_kube(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "sim",
        "run",
        "--scheduler",
        "kube",
        "--trace",
        str(PODS),
        "--cluster",
        str(CLUSTER),
        "--out",
        str(tmp_path / "out"),
        *extra,
    ]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


def test_no_kubeconfig(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert joulesched(run_kube(tmp_path)) == 2
    assert one_line_error(capsys) == "joulesched sim: --scheduler kube: give --kubeconfig FILE (or set $KUBECONFIG)"


def test_missing_kubeconfig_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope.kubeconfig"
    assert joulesched(run_kube(tmp_path, "--kubeconfig", str(missing))) == 2
    assert one_line_error(capsys) == f"joulesched sim: --kubeconfig {missing}: no such file"
    monkeypatch.setenv("KUBECONFIG", str(missing))
    assert joulesched(run_kube(tmp_path)) == 2
    assert one_line_error(capsys) == f"joulesched sim: $KUBECONFIG {missing}: no such file"


def test_a_kubeconfig_that_is_not_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\n", encoding="utf-8")
    assert joulesched(run_kube(tmp_path, "--kubeconfig", str(bad))) == 2
    assert one_line_error(capsys).startswith(f"joulesched sim: --kubeconfig {bad}: cannot use it: ")


def test_unreachable_apiserver(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
""",
        encoding="utf-8",
    )
    assert joulesched(run_kube(tmp_path, "--kubeconfig", str(kubeconfig))) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"joulesched sim: reading the server version: cannot reach the apiserver at https://127.0.0.1:{port} ")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--policies", "energy"], "--policies 'energy': --scheduler kube replays on one real scheduler; name its profile (default, most-allocated)"),
        (["--policies", "default,most-allocated"], "--policies: --scheduler kube replays one profile at a time; name one (or --scheduler-profile)"),
        (["--policies", "default", "--scheduler-profile", "most-allocated"], "--policies default and --scheduler-profile most-allocated disagree"),
        (["--extender-url", "auto"], "--extender-url: not used with --scheduler kube"),
        (["--sensitivity"], "--sensitivity: not used with --scheduler kube"),
    ],
)
def test_options_that_do_not_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    assert joulesched(run_kube(tmp_path, *extra)) == 2
    assert one_line_error(capsys) == f"joulesched sim: {message}"


def test_model_mode_keeps_every_policy_by_default(tmp_path: Path) -> None:
    from joulesched.sim.cli import parse_args

    args = parse_args(["run", "--trace", str(PODS), "--cluster", str(CLUSTER), "--out", str(tmp_path)])
    assert args.scheduler == "model" and args.policies is None
