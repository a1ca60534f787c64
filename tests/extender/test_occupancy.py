"""Which nodes the pod watch sees held by workload pods, and until when (docs/policy.md, "Idle power")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from joulesched.extender.kube import holds_node_until
from joulesched.extender.predicted import Occupancy


def pod(*, owner: str = "ReplicaSet", phase: str = "Running", runtime: str | None = None, start: str | None = "2026-12-01T10:00:00Z") -> dict:
    meta: dict = {"uid": "u1", "name": "p", "namespace": "ns", "ownerReferences": [{"kind": owner, "name": "o"}]}
    if runtime is not None:
        meta["annotations"] = {"joulesched.io/expected-runtime-seconds": runtime}
    status: dict = {"phase": phase}
    if start is not None:
        status["startTime"] = start
    return {"metadata": meta, "spec": {"nodeName": "n1"}, "status": status}


START = 1796119200.0  # 2026-12-01T10:00:00Z


@pytest.mark.parametrize(
    ("kw", "until"),
    [
        ({}, math.inf),
        ({"runtime": "600"}, START + 600),
        ({"runtime": "600", "start": None}, math.inf),
        ({"runtime": "soon"}, math.inf),
        ({"owner": "DaemonSet"}, None),
        ({"phase": "Succeeded"}, None),
        ({"phase": "Failed", "runtime": "60"}, None),
    ],
    ids=[
        "a pod without a declared runtime holds its node for good",
        "a declared runtime holds it until start plus runtime",
        "a runtime without a start time holds it for good",
        "an unreadable runtime holds it for good",
        "a DaemonSet pod holds no node",
        "a finished pod holds no node",
        "a failed pod holds no node",
    ],
)
def test_what_holds_a_node(kw: dict, until: float | None) -> None:
    assert holds_node_until(pod(**kw)) == until


def test_occupancy_per_row_is_unknown_until_the_first_listing_then_empty_or_held() -> None:
    occ = Occupancy()
    index = {"a": 0, "b": 1, "c": 2}
    assert np.isnan(occ.per_row(index, 3)).all()
    occ.replace({"p1": ("a", math.inf), "p2": ("b", 500.0), "p3": ("b", 900.0)})
    assert occ.per_row(index, 3).tolist() == [math.inf, 900.0, 0.0]
    occ.forget("p3")
    occ.set("p4", "c", 50.0)
    assert occ.per_row(index, 3).tolist() == [math.inf, 500.0, 50.0]
    occ.set("p9", "not-profiled", math.inf)  # a node without a profile changes nothing
    assert occ.per_row(index, 3).tolist() == [math.inf, 500.0, 50.0]


def test_the_extender_opens_an_empty_node_only_when_nothing_held_is_cheaper(tmp_path) -> None:
    import orjson
    import yaml
    from prometheus_client import CollectorRegistry

    from joulesched.extender.app import create_app
    from joulesched.extender.config import parse_config
    from joulesched.extender.kube import PodBindingWatch
    from joulesched.extender.metrics import ExtenderMetrics
    from tests.extender.support import CURVE, XEON, Clock, make_pod

    profiles = tmp_path / "nodes.yaml"
    profiles.write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {"name": "epyc", "cores": 64, "power_curve_watts": CURVE, "utilisation": 0.0},
                    {"name": "xeon", "cores": 80, "power_curve_watts": XEON, "utilisation": 0.85},
                ]
            }
        )
    )
    config = parse_config(
        {
            "profiles": {"file": {"path": str(profiles)}},
            "policy": {"idle_power": "autoscaled"},
            "predicted_load": {"watch_pods": True},
        },
        "test",
    )
    app = create_app(config, metrics=ExtenderMetrics(CollectorRegistry()), clock=Clock(), background=False)
    ext = app.extensions["joulesched"]["extender"]
    client = app.test_client()

    def scores() -> dict[str, int]:
        body = orjson.dumps({"Pod": make_pod("2", uid="new"), "NodeNames": ["epyc", "xeon"]})
        reply = client.post("/scheduler/prioritize", data=body, content_type="application/json")
        assert reply.status_code == 200, reply.data
        return {h["Host"]: h["Score"] for h in reply.get_json()}

    # Before the watch has listed the pods, nothing is known: both count as held, marginal decides.
    assert scores() == {"epyc": 10, "xeon": 0}
    watch = PodBindingWatch("unused", ext.predicted, Clock(), ext.occupancy)
    ext.occupancy.replace({})
    running = pod()
    running["metadata"]["uid"] = "service-pod"
    running["spec"]["nodeName"] = "xeon"
    watch.handle("ADDED", running)
    # The Xeon is on for its pod anyway; the empty EPYC would be powered for this pod alone.
    assert scores() == {"epyc": 0, "xeon": 10}
    watch.handle("DELETED", running)
    assert scores() == {"epyc": 10, "xeon": 0}


@pytest.mark.parametrize("node", ["host-a", "vm-1"], ids=["the server's own node", "a VM on the server"])
def test_a_pod_on_a_vm_holds_the_physical_server_its_node_stands_on(tmp_path, node: str) -> None:
    """In a virtualised cluster a node is scored on its server's profile (the server-id label);
    a workload pod on that node keeps the server on just as one on the server's own node does,
    so a new pod there answers for no idle energy."""
    import orjson
    import yaml
    from prometheus_client import CollectorRegistry

    from joulesched.extender.app import create_app
    from joulesched.extender.config import parse_config
    from joulesched.extender.metrics import ExtenderMetrics
    from tests.extender.support import CURVE, Clock, make_pod

    profiles = tmp_path / "nodes.yaml"
    profiles.write_text(
        yaml.safe_dump({"nodes": [{"name": "host-a", "server_id": "srv-a", "cores": 64, "power_curve_watts": CURVE}]})
    )
    config = parse_config(
        {"profiles": {"file": {"path": str(profiles)}}, "policy": {"idle_power": "autoscaled"}, "predicted_load": {"watch_pods": True}},
        "test",
    )
    app = create_app(config, metrics=ExtenderMetrics(CollectorRegistry()), clock=Clock(), background=False)
    ext = app.extensions["joulesched"]["extender"]
    ext.node_servers = {"vm-1": "srv-a"}

    def idle_joules() -> float:
        body = orjson.dumps({"Pod": make_pod("4", uid="new"), "NodeNames": [node]})
        reply = app.test_client().post("/scheduler/explain", data=body, content_type="application/json")
        assert reply.status_code == 200, reply.data
        (row,) = reply.get_json()["nodes"]
        assert "neutral" not in row  # scored on srv-a's profile
        return float(row["estimate"]["idle_energy_joules"])

    ext.occupancy.replace({})
    assert idle_joules() > 0.0  # an empty server would be powered for this pod alone
    ext.occupancy.replace({"service-pod": (node, math.inf)})
    assert idle_joules() == 0.0


def test_occupancy_kept_current_per_binding_equals_a_full_pass() -> None:
    import random

    rng = random.Random(3)
    index = {"a": 0, "b": 1, "c": 2, "a-alias": 0}  # two node names on one physical server
    occ = Occupancy()
    occ.replace({"p0": ("b", 100.0)})
    for step in range(2000):
        uid = f"p{rng.randrange(40)}"
        if rng.random() < 0.7:
            occ.set(uid, rng.choice(["a", "b", "c", "a-alias", "elsewhere"]), rng.choice([10.0, 500.0, math.inf]))
        else:
            occ.forget(uid)
        held = occ.per_row(index, 3)
        want = [0.0, 0.0, 0.0]
        for node, until in occ._ends.values():
            row = index.get(node)
            if row is not None:
                want[row] = max(want[row], until)
        assert held.tolist() == want, step
        assert not held.flags.writeable


def test_a_pod_asked_about_again_does_not_hold_the_node_its_own_placement_is_on(tmp_path) -> None:
    # The pod's top choice is recorded on "epyc" when prioritize answers. Asked about again
    # (explain, a retry), it is not its own load: the node stays empty, and the pod still pays
    # for powering it, as the first time. Another pod bound there and deleted since leaves the
    # incremental sum a float residue (0.1 + 0.2 - 0.1 is not 0.2), which must not read as a
    # pod on the node either; while that pod is there, the node is powered anyway.
    import yaml
    from prometheus_client import CollectorRegistry

    from joulesched.extender.app import create_app
    from joulesched.extender.config import parse_config
    from joulesched.extender.metrics import ExtenderMetrics
    from tests.extender.support import CURVE, XEON, Clock, make_pod

    profiles = tmp_path / "nodes.yaml"
    profiles.write_text(yaml.safe_dump({"nodes": [
        {"name": "epyc", "cores": 64, "power_curve_watts": CURVE, "utilisation": 0.0},
        {"name": "xeon", "cores": 80, "power_curve_watts": XEON, "utilisation": 0.0},
    ]}))
    config = parse_config(
        {"profiles": {"file": {"path": str(profiles)}}, "policy": {"idle_power": "autoscaled"},
         "predicted_load": {"watch_pods": True}},
        "test",
    )
    clock = Clock()
    app = create_app(config, metrics=ExtenderMetrics(CollectorRegistry()), clock=clock, background=False)
    ext = app.extensions["joulesched"]["extender"]
    ext.occupancy.replace({})  # the watch listed: both nodes empty

    def idle_joules(uid: str) -> dict[str, float]:
        import orjson

        body = orjson.dumps({"Pod": make_pod("200m", uid=uid, name=uid), "NodeNames": ["epyc", "xeon"]})
        return {n["node"]: n["estimate"]["idle_energy_joules"] for n in ext.explain(body)["nodes"]}

    first = idle_joules("a")
    assert first["epyc"] > 0 and first["xeon"] > 0
    ext.predicted.record("b", "epyc", 0.1, 0.0, clock(), confirmed=True)
    ext.predicted.record("a", "epyc", 0.2, 0.0, clock(), confirmed=False)
    assert idle_joules("a") == {**first, "epyc": 0.0}  # b's node is powered anyway
    ext.predicted.forget("b")
    assert idle_joules("a") == first
