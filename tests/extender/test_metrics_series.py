"""The extender's series: there from a worker's start, merged across workers, gone with their node.

* Counters of a known, bounded label set exist at 0 from the start (in multiprocess mode in
  every worker's file, summed into one series): a series created by its first event hides that
  event from ``increase()``.
* ``predicted_pods`` is one ledger seen by every worker: never summed across them.
* An evicted node's per-node gauges (NaN in a worker's file) are left out of the scrape.
* The latency histogram observes the verbs' error answers too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from flask import Flask
from prometheus_client.parser import text_string_to_metric_families

from joulesched.extender.metrics import BIND_WAIT_OUTCOMES, KNOWN_FAILURES, NEUTRAL_REASONS, VERBS, ExtenderMetrics
from tests.extender.support import make_pod, post

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _run(code: str, metrics_dir: Path) -> str:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return done.stdout.decode()


# the workers' files as /metrics merges them, read by a process that writes none itself
SCRAPE = """
import sys
from prometheus_client import CollectorRegistry, generate_latest
from joulesched.extender.metrics import WorkerFilesCollector
registry = CollectorRegistry()
WorkerFilesCollector(registry)
sys.stdout.write(generate_latest(registry).decode())
"""


def _samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def _get(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


# -- counters at 0 from the start -----------------------------------------------------------------


def test_every_worker_exports_the_known_counters_at_zero_once(tmp_path: Path) -> None:
    # a worker that has counted nothing: its file alone gives the zeros
    _run("from joulesched.extender.metrics import ExtenderMetrics\nExtenderMetrics()\n", tmp_path)
    got = _samples(_run(SCRAPE, tmp_path))
    assert _get(got, "joulesched_extender_failures_total", verb="filter", reason="bad_request") == 0.0
    assert _get(got, "joulesched_extender_neutral_scores_total", reason="unknown") == 0.0
    # a second worker (each its own process, as under gunicorn) has counted a failure
    _run(
        "from joulesched.extender.metrics import ExtenderMetrics\n"
        "ExtenderMetrics().failures.labels('prioritize', 'bad_request').inc()\n",
        tmp_path,
    )
    got = _samples(_run(SCRAPE, tmp_path))  # (duplicate series fail here)
    for verb, reason in KNOWN_FAILURES:
        want = 1.0 if (verb, reason) == ("prioritize", "bad_request") else 0.0
        assert _get(got, "joulesched_extender_failures_total", verb=verb, reason=reason) == want, (verb, reason)
    for reason in NEUTRAL_REASONS:
        assert _get(got, "joulesched_extender_neutral_scores_total", reason=reason) == 0.0
    assert _get(got, "joulesched_extender_filtered_nodes_total", reason="power_cap") == 0.0
    for outcome in BIND_WAIT_OUTCOMES:
        assert _get(got, "joulesched_extender_bind_waits_total", outcome=outcome) == 0.0
        assert _get(got, "joulesched_extender_bind_wait_seconds_total", outcome=outcome) == 0.0


def test_the_known_verbs_are_the_endpoints(make_app: Callable[..., tuple[Flask, ExtenderMetrics]]) -> None:
    app, _ = make_app()
    assert tuple(app.extensions["joulesched"]["endpoint"].handlers) == VERBS


def test_the_app_exports_its_counters_at_zero_before_any_request(
    make_app: Callable[..., tuple[Flask, ExtenderMetrics]],
) -> None:
    app, _ = make_app()
    got = _samples(app.test_client().get("/metrics").data.decode())
    assert _get(got, "joulesched_extender_profile_source_errors_total", source="file") == 0.0
    assert _get(got, "joulesched_extender_failures_total", verb="filter", reason="bad_request") == 0.0
    assert _get(got, "joulesched_extender_neutral_scores_total", reason="stale") == 0.0
    assert _get(got, "joulesched_extender_filtered_nodes_total", reason="power_cap") == 0.0
    assert _get(got, "joulesched_extender_bind_waits_total", outcome="deadline") == 0.0


# -- predicted pods ----------------------------------------------------------------------------------


def _set_predicted(value: int) -> str:
    return f"from joulesched.extender.metrics import ExtenderMetrics\nExtenderMetrics().predicted_pods.set({value})\n"


def test_predicted_pods_is_not_summed_across_workers(tmp_path: Path) -> None:
    # every worker's pod watch sees every binding: their ledgers hold the same 3 pods
    _run(_set_predicted(3), tmp_path)
    _run(_set_predicted(3), tmp_path)
    assert _get(_samples(_run(SCRAPE, tmp_path)), "joulesched_extender_predicted_pods") == 3.0  # was 6


def test_predicted_pods_is_the_latest_workers_not_an_idle_workers_old_peak(tmp_path: Path) -> None:
    _run(_set_predicted(40), tmp_path)  # a burst, answered by a worker idle since
    _run(_set_predicted(2), tmp_path)  # the ledger now, as the worker answering decisions sees it
    assert _get(_samples(_run(SCRAPE, tmp_path)), "joulesched_extender_predicted_pods") == 2.0


# -- evicted nodes ------------------------------------------------------------------------------------

WRITER = """
import sys, types
import numpy as np
from joulesched.extender.metrics import ExtenderMetrics, NodeGaugeWriter

def decision(names, score, at):
    ev = types.SimpleNamespace(scores=np.array([score] * len(names)), marginal_watts=np.array([12.5] * len(names)))
    return types.SimpleNamespace(evaluation=ev, args=types.SimpleNamespace(node_names=names),
                                 snapshot=types.SimpleNamespace(ready=False), rows=np.arange(len(names)), at=at)

m = ExtenderMetrics()
assert m.multiprocess
last = {{"d": decision({first}, {score}, 1000.0)}}
w = NodeGaugeWriter(m, lambda: last["d"])
w.write_once()
if {later}:
    last["d"] = decision({later}, {score}, 1000.0 + 2 * 3600)  # two hours on: the first nodes are gone
    w.write_once()
"""


def test_a_node_every_worker_evicted_has_no_series(tmp_path: Path) -> None:
    _run(WRITER.format(first=["gone-1", "gone-2"], score=7.0, later=["new-1"]), tmp_path)
    got = _samples(_run(SCRAPE, tmp_path))
    for name in ("joulesched_extender_node_score", "joulesched_extender_node_marginal_watts"):
        assert _get(got, name, node="gone-1") is None  # was NaN, for ever
        assert _get(got, name, node="gone-2") is None
    assert _get(got, "joulesched_extender_node_score", node="new-1") == 7.0
    assert _get(got, "joulesched_extender_node_marginal_watts", node="new-1") == 12.5


def test_a_node_one_worker_evicted_keeps_the_score_another_worker_gave(tmp_path: Path) -> None:
    _run(WRITER.format(first=["shared"], score=6.0, later=[]), tmp_path)  # still scores it
    _run(WRITER.format(first=["shared"], score=7.0, later=["other"]), tmp_path)  # evicted it, later
    got = _samples(_run(SCRAPE, tmp_path))
    assert _get(got, "joulesched_extender_node_score", node="shared") == 6.0


# -- latency of error answers -------------------------------------------------------------------------


def test_the_latency_of_error_answers_is_observed(make_app: Callable[..., tuple[Flask, ExtenderMetrics]]) -> None:
    app, _ = make_app({"max_request_bytes": 4096})
    c = app.test_client()
    pod = make_pod()
    assert post(c, "prioritize", {"Pod": pod, "NodeNames": ["efficient"]})[0] == 200
    assert post(c, "prioritize", b"not json")[0] == 400
    assert post(c, "filter", b"x" * 5000)[0] == 413
    assert post(c, "nonsense", {})[0] == 404
    got = _samples(c.get("/metrics").data.decode())
    count = "joulesched_extender_request_duration_seconds_count"
    assert _get(got, count, verb="prioritize") == 2.0  # the 200 and the 400
    assert _get(got, count, verb="filter") == 1.0  # the 413
    assert _get(got, count, verb="unknown") == 1.0  # the 404
    assert _get(got, "joulesched_extender_requests_total", verb="prioritize", code="400") == 1.0
    # a wrong method is refused before the endpoint takes the request: counted, not timed
    assert c.get("/scheduler/bind").status_code == 405
    got = _samples(c.get("/metrics").data.decode())
    assert _get(got, "joulesched_extender_failures_total", verb="bind", reason="method") == 1.0
    assert _get(got, count, verb="bind") == 0.0
