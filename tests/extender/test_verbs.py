"""Every verb in both protocol modes, through the Flask app, with exact reply shapes."""

from __future__ import annotations

import logging
import random

import numpy as np
import orjson
import pytest
import yaml
from flask.testing import FlaskClient
from prometheus_client import generate_latest

from joulesched.extender import wire
from joulesched.extender.config import parse_config
from joulesched.extender.service import scheduler_binds
from joulesched.policy.errors import ConfigError
from tests.extender.support import CURVE, Clock, make_node, make_pod, post

NAMES = ["efficient", "hungry", "capped", "stranger"]


MODES = ["names", "nodes", "nodes-decoded"]
MODE_IDS = ["nodeCacheCapable true", "nodeCacheCapable false", "nodeCacheCapable false, another encoding"]


def args(mode: str, names: list[str] = NAMES, pod: dict | None = None) -> dict:
    pod = pod or make_pod()
    if mode == "names":
        return {"Pod": pod, "NodeNames": names}
    items = [make_node(n) for n in names]
    if mode == "nodes":  # kube-scheduler's encoding: read without decoding the nodes
        return {"Pod": pod, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    return {"Pod": pod, "Nodes": {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": items}}


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_prioritize_answers_a_bare_array_of_integer_scores_one_per_candidate(client: FlaskClient, mode: str) -> None:
    status, reply = post(client, "prioritize", args(mode))
    assert status == 200
    assert isinstance(reply, list)
    assert [h["Host"] for h in reply] == NAMES
    assert all(set(h) == {"Host", "Score"} for h in reply)
    assert all(type(h["Score"]) is int and 0 <= h["Score"] <= 10 for h in reply)
    scores = {h["Host"]: h["Score"] for h in reply}
    assert scores["efficient"] == 10
    assert scores["hungry"] < 10
    assert scores["capped"] == 0  # over its power cap
    assert scores["stranger"] == 5  # no profile: neutral, never the best


def test_prioritize_wire_bytes_are_what_kube_schedulers_decoder_reads(client: FlaskClient) -> None:
    reply = client.post("/scheduler/prioritize", data=orjson.dumps(args("names", ["efficient"])))
    assert reply.data == b'[{"Host":"efficient","Score":10}]'
    assert reply.mimetype == "application/json"


def test_prioritize_wire_bytes_are_orjsons_whatever_the_names_and_scores() -> None:
    # The reply is encoded without a dict a candidate (wire.encode_host_priority_list): byte for
    # byte what orjson writes for the list of dicts, for names JSON must escape too.
    odd = ['a","b', "c\\", '"', "", "é", "\\\",\"", "x\u2028y", "tab\there", "n-1"]
    rng = random.Random(1)
    fuzz = ["".join(rng.choice('",\\a\x01\u2028') for _ in range(rng.randint(0, 4))) for _ in range(3000)]
    for names, scores in [
        (['a",', "b"], [0, 1]),  # a name ending in `",` then another: `","` inside the first
        (['",', "b"], [0, 1]),
        (['\\",', "b", 'x",'], [0, 1, 2]),
        *[(fuzz[i : i + 3], [1, 2, 3][: len(fuzz[i : i + 3])]) for i in range(0, 3000, 3)],
        (odd, [3, 0, 10, 5, 1, 2, 9, 4, 7]),
        (["only"], [10]),
        (["a", "b"], [3, 7]),
        (["a", "b", "c"], np.array([3, 7, 0])),  # as prioritize passes them
        ([], []),
        ([f"node-{i:05d}" for i in range(1000)], [i % 11 for i in range(1000)]),
        (["a", "b"], [-1, 5]),  # outside any reply's scores: encoded the plain way, the same bytes
        (["a", "b"], [5, 1000]),
    ]:
        assert wire.encode_host_priority_list(names, scores) == orjson.dumps(wire.host_priority_list(names, np.asarray(scores).tolist()))
    with pytest.raises(ValueError, match="2 candidates but 1 scores"):
        wire.encode_host_priority_list(["a", "b"], [1])


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_filter_fails_capped_nodes_as_unresolvable_and_keeps_the_rest(client: FlaskClient, mode: str) -> None:
    status, reply = post(client, "filter", args(mode))
    assert status == 200
    assert set(reply) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert reply["NodeNames"] == ["efficient", "hungry", "stranger"]
    assert reply["FailedNodes"] == {}
    assert list(reply["FailedAndUnresolvableNodes"]) == ["capped"]
    assert "power cap" in reply["FailedAndUnresolvableNodes"]["capped"]
    assert reply["Error"] == ""
    if mode != "names":
        sent = {n["metadata"]["name"]: n for n in args(mode)["Nodes"]["items"]}
        assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == reply["NodeNames"]
        assert all(n == sent[n["metadata"]["name"]] for n in reply["Nodes"]["items"])  # echoed unchanged
    else:
        assert reply["Nodes"] is None


def test_filter_never_leaves_both_node_fields_null_even_when_all_fail(client: FlaskClient) -> None:
    status, reply = post(client, "filter", args("names", ["capped"]))
    assert status == 200 and reply["NodeNames"] == [] and "capped" in reply["FailedAndUnresolvableNodes"]


def test_empty_candidate_list_is_answered_not_rejected(client: FlaskClient) -> None:
    assert post(client, "prioritize", args("names", [])) == (200, [])
    for mode in ("nodes", "nodes-decoded"):
        status, reply = post(client, "filter", args(mode, []))
        assert status == 200 and reply["Nodes"]["items"] == [] and reply["NodeNames"] == []


def test_keys_are_matched_like_gos_decoder_case_insensitively(client: FlaskClient) -> None:
    status, reply = post(client, "prioritize", {"pod": make_pod(), "nodenames": ["efficient"]})
    assert status == 200 and reply == [{"Host": "efficient", "Score": 10}]


def test_explain_names_inputs_estimate_score_and_reasons(client: FlaskClient) -> None:
    status, reply = post(client, "explain", args("names"))
    assert status == 200
    nodes = {n["node"]: n for n in reply["nodes"]}
    eff = nodes["efficient"]
    assert eff["inputs"]["pue"] == 1.1 and eff["inputs"]["carbon_intensity_g_per_kwh"] == 55
    assert eff["inputs"]["utilisation_measured"] == 0.3
    assert eff["estimate"]["marginal_watts"] > 0 and eff["estimate"]["carbon_grams"] > 0
    assert "power cap" in nodes["capped"]["filtered"]
    assert nodes["stranger"]["neutral"] == "no profile for this node"
    assert reply["demand"]["cpu_cores"] == 4 and reply["demand"]["basis"] == "requests"
    assert reply["policy"]["strategy"] == "energy"


def test_preempt_keeps_proposed_victims_minus_filtered_nodes(client: FlaskClient) -> None:
    meta = {
        "Pod": make_pod(),
        "NodeNameToMetaVictims": {
            "efficient": {"Pods": [{"UID": "v1"}, {"UID": "v2"}], "NumPDBViolations": 1},
            "capped": {"Pods": [{"UID": "v3"}], "NumPDBViolations": 0},
        },
    }
    status, reply = post(client, "preempt", meta)
    assert status == 200
    assert reply == {"NodeNameToMetaVictims": {"efficient": {"Pods": [{"UID": "v1"}, {"UID": "v2"}], "NumPDBViolations": 1}}}
    full = {
        "Pod": make_pod(),
        "NodeNameToVictims": {"hungry": {"Pods": [{"metadata": {"uid": "v9", "name": "x"}}], "NumPDBViolations": 0}},
    }
    status, reply = post(client, "preempt", full)
    assert reply == {"NodeNameToMetaVictims": {"hungry": {"Pods": [{"UID": "v9"}], "NumPDBViolations": 0}}}


def test_bind_is_off_by_default(client: FlaskClient) -> None:
    status, reply = post(client, "bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "efficient"})
    assert status == 404 and "bind.enabled" in reply["Error"]


def test_bind_reports_api_failures_in_error_and_records_the_placement(make_app) -> None:  # type: ignore[no-untyped-def]
    app, _ = make_app()
    ext = app.extensions["joulesched"]["extender"]
    calls = []

    def binder(b):  # type: ignore[no-untyped-def]
        calls.append(b)
        if b.node == "hungry":
            raise RuntimeError('pods "p" is forbidden')

    ext.binder = binder
    c = app.test_client()
    ok = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-1", "Node": "efficient"}
    assert post(c, "bind", ok) == (200, {"Error": ""})
    assert ext.predicted.placement("uid-1").node == "efficient"
    status, reply = post(c, "bind", {**ok, "PodUID": "uid-2", "Node": "hungry"})
    assert status == 200 and "forbidden" in reply["Error"]
    assert len(calls) == 2
    # kept: kube-scheduler (ignorable) binds the pod to that node itself, or schedules it again
    assert ext.predicted.placement("uid-2").node == "hungry"


def bind(c: FlaskClient, pod: str, node: str) -> tuple[int, object]:
    """kube-scheduler's bind of pod ``pod`` (its name and UID) to ``node``."""
    return post(c, "bind", {"PodName": pod, "PodNamespace": "default", "PodUID": pod, "Node": node})


def test_bind_records_the_placement_before_the_api_call(make_app) -> None:  # type: ignore[no-untyped-def]
    # The next pod's filter is answered while this API call is in flight: it must see the pod.
    app, _ = make_app()
    ext = app.extensions["joulesched"]["extender"]
    seen = []
    ext.binder = lambda b: seen.append(ext.predicted.placement(b.pod_uid))
    c = app.test_client()
    post(c, "filter", args("names", ["efficient", "hungry"], make_pod("4", uid="a", name="a")))
    assert bind(c, "a", "hungry") == (200, {"Error": ""})
    (placed,) = seen
    assert placed is not None and (placed.node, placed.cores, placed.confirmed) == ("hungry", 4.0, True)


def test_bind_with_write_off_records_the_placement_and_says_kube_scheduler_binds(make_app, caplog) -> None:  # type: ignore[no-untyped-def]
    # bind.write: false. The bind verb records where the pod went, as it does before its API
    # write, and answers an Error that says kube-scheduler binds: kube-scheduler, its entry
    # ignorable, then binds the pod with its own binder. Nothing is written here, and the
    # answer is not logged as a failed bind.
    app, metrics = make_app({"bind": {"enabled": True, "write": False}})
    ext = app.extensions["joulesched"]["extender"]
    assert ext.binder is scheduler_binds  # itself, not wrapped in the binds-in-flight gauge
    c = app.test_client()
    post(c, "filter", args("names", ["efficient", "hungry"], make_pod("4", uid="a", name="a")))
    with caplog.at_level(logging.INFO, logger="joulesched"):
        assert bind(c, "a", "hungry") == (200, {"Error": "joulesched: default/a on hungry recorded; kube-scheduler binds it (bind.write: false)"})
    placed = ext.predicted.placement("a")
    assert placed is not None and (placed.node, placed.cores, placed.confirmed) == ("hungry", 4.0, True)
    assert not [r for r in caplog.records if r.name.startswith("joulesched")], caplog.records
    assert metrics.registry.get_sample_value("joulesched_extender_requests_total", {"verb": "bind", "code": "200"}) == 1
    # Binds come through the verb, so the next pod's decision waits for those before it (as
    # with the API write): this one has come, and nothing is left to wait for.
    assert ext.unbound.active("") and not ext.unbound._waiting


def test_bind_write_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError, match=r"bind\.write"):
        parse_config({"bind": {"enabled": True, "write": "no"}}, "test.yaml")


@pytest.mark.parametrize("keeps", ["best", "top"])
def test_filter_keeping_the_best_node_spreads_a_burst_by_its_own_choices(make_app, tmp_path, keeps) -> None:  # type: ignore[no-untyped-def]
    # policy.filter_keeps: best. filter answers one node, where kube-scheduler then places the
    # pod without calling prioritize, so the ledger records it at once and the next pod's
    # filter counts it. Six 3-core pods on three empty 8-core nodes: a node's second pod costs
    # less than an empty node's first (its curve's steep first 10 % paid already), a third
    # would take it past its cores. Without the record all six would go to n0. With top,
    # prioritize is left out too: filter keeps the nodes ranked first and records the
    # extender's own top choice among them as the pod's place, as prioritize does with all,
    # so the same holds with the bind verb off.
    path = tmp_path / "burst.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"name": f"n{i}", "cores": 8, "power_curve_watts": CURVE, "utilisation": 0.0} for i in range(3)]}))
    app, _ = make_app({"profiles": {"file": {"path": str(path)}}, "policy": {"filter_keeps": keeps}})
    ext = app.extensions["joulesched"]["extender"]
    c = app.test_client()
    chosen, kept = [], []
    for i in range(6):
        status, reply = post(c, "filter", args("names", ["n0", "n1", "n2"], make_pod("3", uid=f"u{i}", name=f"p{i}")))
        assert status == 200 and not reply["FailedAndUnresolvableNodes"], reply
        placed = ext.predicted.placement(f"u{i}")
        assert placed is not None and (placed.cores, placed.confirmed) == (3.0, False)
        assert reply["NodeNames"] == [placed.node] if keeps == "best" else placed.node in reply["NodeNames"], reply
        chosen.append(placed.node)
        kept.append(len(reply["NodeNames"]))
    assert chosen == ["n0", "n0", "n1", "n1", "n2", "n2"]
    assert kept[0] == (1 if keeps == "best" else 3)  # the first pod: three empty nodes alike


def test_filter_counts_what_it_kept(make_app, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # joulesched_extender_filter_answers_total{kept}: with filter_keeps: best the one node
    # ranked first while a node with fresh measurements ranks first; once they are stale,
    # every node for kube-scheduler to choose (the gap is counted, not hidden). top: the nodes
    # ranked first. all: every node the cap passes. A filter that keeps no node counts nothing.
    def answers(text: str) -> dict[str, float]:
        found = {}
        for line in text.splitlines():
            for kept in ("all", "top", "best"):
                if line.startswith(f'joulesched_extender_filter_answers_total{{kept="{kept}"}}'):
                    found[kept] = float(line.rsplit(" ", 1)[1])
        return found

    clock = Clock()
    nodes = [{"name": f"n{i}", "cores": 8, "power_curve_watts": CURVE, "utilisation": 0.0, "updated": clock.now} for i in range(2)]
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump({"nodes": nodes}))
    policy = {"filter_keeps": "best", "max_age_seconds": 120}
    app, _ = make_app({"profiles": {"file": {"path": str(path)}}, "policy": policy}, clock=clock)
    c = app.test_client()
    assert answers(c.get("/metrics").data.decode()) == {"all": 0.0, "top": 0.0, "best": 0.0}
    status, reply = post(c, "filter", args("names", ["n0", "n1"], make_pod("1", uid="a", name="a")))
    assert status == 200 and len(reply["NodeNames"]) == 1
    clock.now += 121  # the profiles' measurements are now older than max_age_seconds
    status, reply = post(c, "filter", args("names", ["n0", "n1"], make_pod("1", uid="b", name="b")))
    assert status == 200 and reply["NodeNames"] == ["n0", "n1"]
    assert answers(c.get("/metrics").data.decode()) == {"all": 1.0, "top": 0.0, "best": 1.0}

    # top: every node tied at the top score, here both
    app, _ = make_app({"profiles": {"file": {"path": str(path)}}, "policy": {**policy, "filter_keeps": "top"}}, clock=Clock())
    c = app.test_client()
    status, reply = post(c, "filter", args("names", ["n0", "n1"], make_pod("1", uid="t", name="t")))
    assert status == 200 and reply["NodeNames"] == ["n0", "n1"]
    assert answers(c.get("/metrics").data.decode()) == {"all": 0.0, "top": 1.0, "best": 0.0}

    app, _ = make_app()  # filter_keeps: all
    c = app.test_client()
    post(c, "filter", args("names", ["efficient", "hungry"], make_pod("4", uid="c", name="c")))
    post(c, "filter", args("names", ["capped"], make_pod("8", uid="d", name="d")))  # kept none
    assert answers(c.get("/metrics").data.decode()) == {"all": 1.0, "top": 0.0, "best": 0.0}


def test_a_filter_that_leaves_one_node_records_it_as_the_pods_place(make_app) -> None:  # type: ignore[no-untyped-def]
    # With one feasible node kube-scheduler does not ask prioritize: the filter's answer is
    # where the pod goes (filter_keeps: all, one candidate under its cap).
    app, _ = make_app()
    ext = app.extensions["joulesched"]["extender"]
    c = app.test_client()
    status, reply = post(c, "filter", args("names", ["efficient", "capped"], make_pod("8", uid="one", name="one")))
    assert status == 200 and reply["NodeNames"] == ["efficient"] and list(reply["FailedAndUnresolvableNodes"]) == ["capped"]
    placed = ext.predicted.placement("one")
    assert placed is not None and (placed.node, placed.cores, placed.confirmed) == ("efficient", 8.0, False)
    post(c, "filter", args("names", ["efficient", "hungry"], make_pod("8", uid="two", name="two")))
    assert ext.predicted.placement("two") is None  # two passed: prioritize's top choice will say


def test_a_request_abandoned_by_its_client_is_counted_and_a_binds_placement_kept_unsent(make_app) -> None:  # type: ignore[no-untyped-def]
    # The worker hands VerbEndpoint.abandon a request whose client closed the connection
    # before a thread took it (kube-scheduler's httpTimeout): a decision is not evaluated, a
    # bind's placement is recorded (kube-scheduler binds the pod there itself, or schedules it
    # again) and its binding not sent; each counted as 499 and client_gone.
    app, _ = make_app()
    ext = app.extensions["joulesched"]["extender"]
    endpoint = app.extensions["joulesched"]["endpoint"]
    metrics = app.extensions["joulesched"]["metrics"]
    sent = []
    ext.binder = sent.append
    c = app.test_client()
    post(c, "filter", args("names", ["efficient", "hungry"], make_pod("4", uid="a", name="a")))
    decided = ext.last
    endpoint.abandon("prioritize", orjson.dumps(args("names", ["efficient", "hungry"], make_pod("4", uid="b", name="b"))))
    assert ext.last is decided and ext.predicted.placement("b") is None  # not evaluated
    endpoint.abandon("bind", orjson.dumps({"PodName": "a", "PodNamespace": "default", "PodUID": "a", "Node": "hungry"}))
    assert sent == []
    placed = ext.predicted.placement("a")
    assert placed is not None and (placed.node, placed.cores, placed.confirmed) == ("hungry", 4.0, True)
    endpoint.abandon("bind", b"{not json")  # nobody waits for it: counted, nothing recorded
    endpoint.abandon("nosuchverb", b"")
    assert metrics.requests.labels("bind", "499")._value.get() == 2
    assert metrics.failures.labels("prioritize", "client_gone")._value.get() == 1
    assert metrics.failures.labels("unknown", "client_gone")._value.get() == 1


def test_a_bind_sent_again_keeps_the_pods_demand_on_its_node(make_app) -> None:  # type: ignore[no-untyped-def]
    # A bind names only the node: the pod's demand comes from its decision, which the first
    # bind of the pod consumes. A second bind (one kube-scheduler gave up on, served late),
    # to the same node or another, must not record the pod again with none (its load off the
    # ledger): it keeps the demand of the placement the ledger has.
    app, _ = make_app()
    ext = app.extensions["joulesched"]["extender"]
    sent = []
    ext.binder = lambda b: sent.append((b.pod_uid, ext.predicted.placement(b.pod_uid)))
    c = app.test_client()
    post(c, "filter", args("names", ["efficient", "hungry"], make_pod("4", uid="a", name="a")))
    for _ in range(2):
        assert bind(c, "a", "hungry") == (200, {"Error": ""})
    placed = ext.predicted.placement("a")
    assert placed is not None and (placed.node, placed.cores, placed.confirmed) == ("hungry", 4.0, True)
    assert sent == [("a", placed), ("a", placed)]  # each sent, as kube-scheduler asked
    arrays = ext.source.snapshot().arrays
    cores, _, _ = ext.predicted.per_row(arrays.index, arrays.updated, placed.at)
    assert cores[arrays.index["hungry"]] == 4.0 and cores[arrays.index["efficient"]] == 0.0
    # Bound to another node with no decision in between: the pod moves there, with its load.
    assert bind(c, "a", "efficient") == (200, {"Error": ""})
    moved = ext.predicted.placement("a")
    assert moved is not None and (moved.node, moved.cores, moved.confirmed) == ("efficient", 4.0, True)
    cores, _, _ = ext.predicted.per_row(arrays.index, arrays.updated, moved.at)
    assert cores[arrays.index["efficient"]] == 4.0 and cores[arrays.index["hungry"]] == 0.0
    # Decided again (an 8-core request now, as a resized pod's) and bound: the decision's demand.
    post(c, "filter", args("names", ["efficient", "hungry"], make_pod("8", uid="a", name="a")))
    assert bind(c, "a", "hungry") == (200, {"Error": ""})
    again = ext.predicted.placement("a")
    assert again is not None and (again.node, again.cores) == ("hungry", 8.0)


def test_a_bind_after_the_next_pods_request_moves_the_load_to_the_real_node(make_app) -> None:  # type: ignore[no-untyped-def]
    # kube-scheduler binds asynchronously: by the time pod a's bind arrives, pod b has been
    # scored. The bind names only the node; a's demand comes from its top choice, not from b.
    app, _ = make_app()
    ext = app.extensions["joulesched"]["extender"]
    ext.binder = lambda b: None
    c = app.test_client()
    post(c, "prioritize", args("names", ["efficient", "hungry"], make_pod("16", uid="a", name="a")))
    assert ext.predicted.placement("a").node == "efficient"
    post(c, "prioritize", args("names", ["efficient", "hungry"], make_pod("2", uid="b", name="b")))
    assert bind(c, "a", "hungry") == (200, {"Error": ""})
    placed = ext.predicted.placement("a")
    assert (placed.node, placed.cores, placed.confirmed) == ("hungry", 16.0, True)


def test_a_burst_spreads_by_predicted_load_instead_of_herding(make_app) -> None:  # type: ignore[no-untyped-def]
    app, _ = make_app()
    c = app.test_client()
    tops = []
    for i in range(12):
        _, reply = post(c, "prioritize", args("names", ["efficient", "hungry"], make_pod("16", uid=f"u{i}", name=f"p{i}")))
        best = max(reply, key=lambda h: h["Score"])
        tops.append(best["Host"] if [h["Score"] for h in reply].count(best["Score"]) == 1 else "tie")
    # Without predicted load every one of the 12 would have gone to "efficient".
    assert tops[0] == "efficient"
    assert tops.count("efficient") < 12
    assert "hungry" in tops or "tie" in tops


def test_predicted_load_expires_once_measurements_show_the_pod(make_app, profiles_file) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    app, _ = make_app({"predicted_load": {"ttl_seconds": 600, "settle_seconds": 30}}, clock=clock)
    ext = app.extensions["joulesched"]["extender"]
    ext.predicted.record("a", "efficient", 8.0, 0.0, clock.now, confirmed=True)
    arrays = ext.source.snapshot().arrays
    assert ext.predicted.per_row(arrays.index, arrays.updated, clock.now)[0][arrays.index["efficient"]] == 8.0
    clock.now += 601
    assert ext.predicted.per_row(arrays.index, arrays.updated, clock.now)[0].sum() == 0.0


def test_metrics_count_requests_latency_failures_and_neutral_scores(make_app) -> None:  # type: ignore[no-untyped-def]
    app, metrics = make_app()
    c = app.test_client()
    post(c, "prioritize", args("names"))
    post(c, "prioritize", b"not json")
    app.extensions["joulesched"]["gauges"].write_once()
    text = c.get("/metrics").data.decode()
    assert 'joulesched_extender_requests_total{code="200",verb="prioritize"} 1.0' in text
    assert 'joulesched_extender_requests_total{code="400",verb="prioritize"} 1.0' in text
    assert 'joulesched_extender_failures_total{reason="bad_request",verb="prioritize"} 1.0' in text
    assert 'joulesched_extender_request_duration_seconds_count{verb="prioritize"} 2.0' in text  # the 400 is timed too
    assert 'joulesched_extender_neutral_scores_total{reason="unknown"} 1.0' in text
    assert 'joulesched_extender_node_score{node="efficient"} 10.0' in text
    assert 'joulesched_extender_node_marginal_watts{node="efficient"}' in text
    assert text == generate_latest(metrics.registry).decode()


def test_health_and_readiness(client: FlaskClient) -> None:
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 200 and b"3 node profiles from file" in ready.data


def test_virtual_nodes_are_scored_on_the_profile_of_their_physical_server(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import yaml
    from prometheus_client import CollectorRegistry

    from joulesched.extender.app import create_app
    from joulesched.extender.config import parse_config
    from joulesched.extender.metrics import ExtenderMetrics
    from tests.extender.support import CURVE

    path = tmp_path / "hosts.yaml"
    hosts = [
        {"name": "host-a", "server_id": "srv-a", "cores": 64, "power_curve_watts": CURVE},
        {"name": "host-b", "server_id": "srv-b", "cores": 64, "power_curve_watts": [2 * w for w in CURVE]},
    ]
    path.write_text(yaml.safe_dump({"nodes": hosts}))
    app = create_app(parse_config({"profiles": {"file": {"path": str(path)}}}, "t"), metrics=ExtenderMetrics(CollectorRegistry()), background=False)
    c = app.test_client()
    label = "joulesched.io/server-id"
    items = [
        {"metadata": {"name": "vm-1", "labels": {label: "srv-b"}}},
        {"metadata": {"name": "vm-2", "labels": {label: "srv-a"}}},
        {"metadata": {"name": "vm-3"}},
    ]
    expected = [{"Host": "vm-1", "Score": 0}, {"Host": "vm-2", "Score": 10}, {"Host": "vm-3", "Score": 5}]
    # Nodes mode: the labels come with the request, in kube-scheduler's encoding or another.
    assert post(c, "prioritize", {"Pod": make_pod(), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}) == (200, expected)
    assert post(c, "prioritize", {"Pod": make_pod(), "Nodes": {"items": items}}) == (200, expected)
    # NodeNames mode: the labels come from the node watch; the same candidates asked about
    # before and after it names their servers are scored on what is known at each time.
    neutral = [{"Host": h["Host"], "Score": 5} for h in expected]
    assert post(c, "prioritize", {"Pod": make_pod(), "NodeNames": ["vm-1", "vm-2", "vm-3"]}) == (200, neutral)
    app.extensions["joulesched"]["extender"].node_servers = {"vm-1": "srv-b", "vm-2": "srv-a"}
    assert post(c, "prioritize", {"Pod": make_pod(), "NodeNames": ["vm-1", "vm-2", "vm-3"]}) == (200, expected)
    # and explain says so: the inputs of the server's profile, not "no profile for this node"
    status, explained = post(c, "explain", {"Pod": make_pod(), "NodeNames": ["vm-1", "vm-2", "vm-3"]})
    vm1, vm2, vm3 = explained["nodes"]
    assert status == 200 and (vm2["score"], "neutral" in vm2) == (10, False)
    assert vm1["inputs"]["power_curve_watts"] == [2 * w for w in CURVE] and vm2["inputs"]["power_curve_watts"] == CURVE
    assert vm3["neutral"] == "no profile for this node"


def test_node_gauges_are_created_a_few_per_tick_and_rewritten_only_when_they_change(make_app) -> None:  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    import numpy as np

    from joulesched.extender.metrics import NodeGaugeWriter

    _, metrics = make_app()
    names = [f"n{i}" for i in range(5)]

    def decision(scores: list[int]) -> SimpleNamespace:
        ev = SimpleNamespace(scores=np.array(scores), marginal_watts=np.array([1.5] * 5))
        snap = SimpleNamespace(ready=False)
        return SimpleNamespace(evaluation=ev, args=SimpleNamespace(node_names=names), snapshot=snap, rows=np.arange(5), at=0.0)

    current = decision([10, 9, 8, 7, 6])
    writer = NodeGaugeWriter(metrics, lambda: current)
    writer.NEW_PER_TICK = 2
    writer.write_once()
    assert sorted(writer._written) == ["n0", "n1"]  # the budget: two new nodes per tick
    writer.write_once()
    writer.write_once()
    assert sorted(writer._written) == names  # the same decision is finished on the next ticks
    text = generate_latest(metrics.registry).decode()
    assert 'joulesched_extender_node_score{node="n4"} 6.0' in text
    child = writer._written["n0"][0]
    calls = []
    child.set = lambda value: calls.append(value)  # type: ignore[method-assign]
    current = decision([10, 9, 8, 7, 5])
    writer.write_once()
    assert calls == []  # n0 unchanged: not written again
    assert 'joulesched_extender_node_score{node="n4"} 5.0' in generate_latest(metrics.registry).decode()


def test_a_config_whose_bind_wait_would_starve_its_own_bind_is_refused() -> None:
    import pytest

    from joulesched.extender.config import parse_config
    from joulesched.policy.errors import ConfigError

    # gunicorn's own worker serves binds from server.threads: a decision waiting would hold the only one.
    with pytest.raises(ConfigError, match=r"server\.threads: must be 2 or more with server\.worker: gthread, bind\.enabled"):
        parse_config({"bind": {"enabled": True}, "server": {"threads": 1, "worker": "gthread"}}, "t.yaml")
    assert parse_config({"bind": {"enabled": True}, "server": {"threads": 2, "worker": "gthread"}}, "t.yaml").server.threads == 2
    # The buffered worker serves binds that write nothing on server.threads too: the waiting
    # decision's, the ones waiting for a next request (half), and one for the bind.
    for threads in (1, 2):
        with pytest.raises(ConfigError, match=r"server\.threads: must be 3 or more with bind\.write: false"):
            parse_config({"bind": {"enabled": True, "write": False}, "server": {"threads": threads}}, "t.yaml")
    assert parse_config({"bind": {"enabled": True, "write": False}, "server": {"threads": 3}}, "t.yaml").server.threads == 3
    assert parse_config({"bind": {"enabled": True, "write": False, "wait_seconds": 0}, "server": {"threads": 1}}, "t.yaml").server.threads == 1
    # It serves binds that write on bind.threads of their own.
    assert parse_config({"bind": {"enabled": True}, "server": {"threads": 1}}, "t.yaml").server.threads == 1
    with pytest.raises(ConfigError, match=r"bind\.wait_seconds"):
        parse_config({"bind": {"enabled": True, "wait_seconds": 1.0}}, "t.yaml")  # kube-scheduler's httpTimeout
    assert parse_config({"bind": {"enabled": True, "wait_seconds": 0}, "server": {"threads": 1}}, "t.yaml").server.threads == 1


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_a_pods_prioritize_after_its_filter_reuses_the_filters_evaluation_while_nothing_changed(make_app, monkeypatch, mode) -> None:  # type: ignore[no-untyped-def]
    # kube-scheduler's cycle: filter over the candidates, prioritize over the nodes it passed.
    from joulesched.extender import service

    evaluations = []
    real = service.evaluate
    monkeypatch.setattr(service, "evaluate", lambda *a, **kw: evaluations.append(a[1].tolist()) or real(*a, **kw))
    clock = Clock()
    app, _ = make_app(clock=clock)
    ext = app.extensions["joulesched"]["extender"]
    c = app.test_client()
    pod = make_pod("4", uid="a", name="a")
    status, reply = post(c, "filter", args(mode, NAMES, pod))
    assert status == 200 and list(reply["FailedAndUnresolvableNodes"]) == ["capped"]  # left out of prioritize, as kube-scheduler does
    passed = [n for n in NAMES if n != "capped"]
    clock.tick(0.2)
    status, scores = post(c, "prioritize", args(mode, passed, pod))
    assert status == 200 and len(evaluations) == 1
    fresh_app, _ = make_app(clock=Clock(clock.now - 0.2))
    assert post(fresh_app.test_client(), "prioritize", args(mode, passed, pod)) == (200, scores)
    assert ext.last.args.node_names == passed and len(ext.last.rows) == len(ext.last.evaluation.scores) == 3

    # What the evaluation reads changed in between, or too long passed: costed again.
    b = make_pod("4", uid="b", name="b")
    post(c, "filter", args(mode, NAMES, b))
    ext.predicted.record("other", "efficient", 32.0, 0.0, clock.now, confirmed=True)  # a binding
    post(c, "prioritize", args(mode, passed, b))
    assert len(evaluations) == 4
    d = make_pod("4", uid="d", name="d")
    post(c, "filter", args(mode, NAMES, d))
    clock.tick(1.5)
    post(c, "prioritize", args(mode, passed, d))
    assert len(evaluations) == 6
    # another pod, another subset than the filter passed, the same pod changed, or asked again
    e = make_pod("4", uid="e", name="e")
    post(c, "filter", args(mode, NAMES, e))
    post(c, "prioritize", args(mode, passed, make_pod("4", uid="f", name="f")))
    assert len(evaluations) == 8
    post(c, "filter", args(mode, NAMES, e))
    post(c, "prioritize", args(mode, ["efficient", "hungry"], e))
    assert len(evaluations) == 10
    post(c, "filter", args(mode, NAMES, e))
    post(c, "prioritize", args(mode, passed, make_pod("8", uid="e", name="e")))
    assert len(evaluations) == 12
    post(c, "explain", args(mode, passed, make_pod("8", uid="e", name="e")))  # its own top choice now in the ledger
    assert len(evaluations) == 13


@pytest.mark.parametrize("keeps", ["all", "best"])
def test_a_decision_that_waited_for_a_binding_is_counted_with_the_seconds_it_waited(make_app, keeps) -> None:  # type: ignore[no-untyped-def]
    # A pod answered and never bound holds the next decision for bind.wait_seconds: counted
    # once in bind_waits_total and bind_wait_seconds_total{outcome="deadline"}, as /metrics says.
    # So does one whose filter kept one node (filter_keeps: best): the ledger knows its node,
    # but the wait also holds kube-scheduler, which then skips scoring, to the bindings' pace
    # (docs/benchmarks.md, "Choosing the node": without it binds queued past its httpTimeout).
    app, metrics = make_app({"bind": {"enabled": True, "wait_seconds": 0.3}, "policy": {"filter_keeps": keeps}})
    ext = app.extensions["joulesched"]["extender"]
    ext.binder = lambda b: None
    c = app.test_client()
    post(c, "filter", args("names", ["efficient", "hungry"], make_pod("2", uid="a", name="a")))
    assert bind(c, "a", "hungry") == (200, {"Error": ""})  # kube-scheduler binds through the verb
    post(c, "filter", args("names", ["efficient", "hungry"], make_pod("2", uid="b", name="b")))  # never bound
    post(c, "filter", args("names", ["efficient", "hungry"], make_pod("2", uid="c", name="c")))
    text = generate_latest(metrics.registry).decode()
    waits = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
             if line.startswith("joulesched_extender_bind_wait")}
    assert waits['joulesched_extender_bind_waits_total{outcome="deadline"}'] == 1.0
    assert 0.25 < waits['joulesched_extender_bind_wait_seconds_total{outcome="deadline"}'] < 2.0



@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_a_prioritize_with_its_filters_bytes_is_not_read_again_in_names_mode(make_app, monkeypatch, mode) -> None:  # type: ignore[no-untyped-def]
    # Every node passed: kube-scheduler's prioritize is its filter's request again, byte for byte.
    reads = []
    real = wire.parse_extender_args
    monkeypatch.setattr(wire, "parse_extender_args", lambda body, *a: reads.append(bytes(body)) or real(body, *a))
    app, _ = make_app()
    c = app.test_client()
    names = ["efficient", "hungry", "stranger"]
    pod = make_pod("4", uid="a", name="a")
    status, passed = post(c, "filter", args(mode, names, pod))
    assert status == 200 and not passed["FailedAndUnresolvableNodes"]
    status, scores = post(c, "prioritize", args(mode, names, pod))
    read_again = mode != "names"  # full Nodes are not kept from one request to the next
    assert status == 200 and len(reads) == (2 if read_again else 1)
    fresh_app, _ = make_app()  # the same answer as when it is read
    assert post(fresh_app.test_client(), "prioritize", args(mode, names, pod)) == (200, scores)
    # Other bytes are read: another pod, other names, the same pod changed.
    post(c, "prioritize", args(mode, names, make_pod("4", uid="b", name="b")))
    post(c, "prioritize", args(mode, names[:2], pod))
    post(c, "prioritize", args(mode, names, make_pod("8", uid="a", name="a")))
    assert len(reads) == (6 if read_again else 5)
    # A malformed request that follows is still refused, and names what is wrong.
    status, err = post(c, "prioritize", {"Pod": pod, "NodeNames": ["a", 7]})
    assert status == 400 and "ExtenderArgs.NodeNames[1]: must be a string" in err["Error"]
