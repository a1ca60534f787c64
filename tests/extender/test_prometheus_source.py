"""The prometheus profile source against a real Prometheus server scraping agent metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from joulesched.contracts import names as m
from joulesched.extender.app import create_app
from joulesched.extender.config import parse_config
from joulesched.extender.metrics import ExtenderMetrics
from joulesched.extender.profiles import PrometheusSource, profile_queries
from tests.extender.support import make_pod
from tests.prometheus_server import ExpositionServer, PrometheusServer, prometheus_scraping

pytestmark = pytest.mark.prometheus

# What two agents would export (names from measurement.names, the one definition).
AGENTS = f"""\
# TYPE {m.NODE_CPU_CORES.name} gauge
{m.NODE_CPU_CORES.name}{{node="green"}} 64
{m.NODE_CPU_CORES.name}{{node="grey"}} 64
{m.NODE_CPU_CORES.name}{{node="half"}} 8
{m.NODE_CPU_CORES.name}{{node="fresh"}} 64
# TYPE {m.NODE_CPU_UTILISATION.name} gauge
{m.NODE_CPU_UTILISATION.name}{{node="green"}} 0.25
{m.NODE_CPU_UTILISATION.name}{{node="grey"}} 0.25
# TYPE {m.MODEL_IDLE.name} gauge
{m.MODEL_IDLE.name}{{node="green",device="cpu"}} 60
{m.MODEL_IDLE.name}{{node="grey",device="cpu"}} 120
{m.MODEL_IDLE.name}{{node="fresh",device="cpu"}} 60
# TYPE {m.MODEL_PER_CORE.name} gauge
{m.MODEL_PER_CORE.name}{{node="green",device="cpu"}} 3
{m.MODEL_PER_CORE.name}{{node="grey",device="cpu"}} 6
{m.MODEL_PER_CORE.name}{{node="fresh",device="cpu"}} 3
# TYPE {m.NODE_PLATFORM_POWER.name} gauge
{m.NODE_PLATFORM_POWER.name}{{node="green",basis="ipmi_dcmi"}} 108
{m.NODE_PLATFORM_POWER.name}{{node="grey",basis="rapl_sysfs"}} 216
# TYPE {m.NODE_POWER_CAP.name} gauge
{m.NODE_POWER_CAP.name}{{node="grey"}} 230
# TYPE {m.NODE_INFO.name} gauge
{m.NODE_INFO.name}{{node="green",site="north",server_id="srv-1"}} 1
{m.NODE_INFO.name}{{node="grey",site="south",server_id="srv-2"}} 1
# TYPE {m.SITE_PUE.name} gauge
{m.SITE_PUE.name}{{site="north"}} 1.1
{m.SITE_PUE.name}{{site="south"}} 1.5
# TYPE {m.OWNER_CPU_CORES.name} gauge
{m.OWNER_CPU_CORES.name}{{namespace="default",owner_kind="Job",owner="align"}} 1.5
# TYPE {m.SITE_CARBON.name} gauge
{m.SITE_CARBON.name}{{site="north"}} 55
{m.SITE_CARBON.name}{{site="south"}} 440
"""


@pytest.fixture
def prom(tmp_path: Path) -> Iterator[tuple[PrometheusServer, ExpositionServer]]:
    yield from prometheus_scraping(tmp_path, AGENTS)


def test_profiles_from_a_real_prometheus(prom: tuple[PrometheusServer, ExpositionServer]) -> None:
    server, _ = prom
    server.wait_for(f"{m.NODE_INFO.name}", 2)
    server.wait_for(f"{m.SITE_CARBON.name}", 2)
    source = PrometheusSource(server.url, cache_seconds=5)
    snap = source.snapshot()
    assert snap.ready and not snap.error
    by_name = {p.name: p for p in snap.profiles.nodes}
    # "half" has no fitted model yet, "fresh" no utilisation measured (the agent leaves the gauge
    # out): left out, neutral, not taken for idle
    assert set(by_name) == {"green", "grey"}
    green, grey = by_name["green"], by_name["grey"]
    assert green.power_curve_watts[0] == 60 and green.power_curve_watts[-1] == pytest.approx(60 + 3 * 64)
    assert green.measured_watts == 108 and green.utilisation == 0.25
    assert green.pue == 1.1 and green.carbon_intensity == 55 and green.server_id == "srv-1"
    assert grey.power_cap_watts == 230 and grey.site == "south"
    assert green.updated is not None and abs(time.time() - green.updated) < 30


def test_extender_scores_from_prometheus_and_goes_neutral_when_it_fails(
    tmp_path: Path, prom: tuple[PrometheusServer, ExpositionServer]
) -> None:
    server, _ = prom
    server.wait_for(f"{m.NODE_INFO.name}", 2)
    server.wait_for(f"{m.SITE_CARBON.name}", 2)
    config = parse_config(
        {"profiles": {"source": "prometheus", "prometheus": {"url": server.url, "cache_seconds": 0.2, "timeout_seconds": 1}},
         "policy": {"strategy": "carbon", "max_age_seconds": 5}},
        "test",
    )
    metrics = ExtenderMetrics(CollectorRegistry())
    app = create_app(config, metrics=metrics, background=False)
    c = app.test_client()
    body = orjson.dumps({"Pod": make_pod("8"), "NodeNames": ["green", "grey", "half"]})
    scores = {h["Host"]: h["Score"] for h in orjson.loads(c.post("/scheduler/prioritize", data=body).data)}
    assert scores == {"green": 10, "grey": 0, "half": 5}
    assert c.get("/readyz").status_code == 200
    filt = orjson.loads(c.post("/scheduler/filter", data=body).data)
    assert "grey" in filt["FailedAndUnresolvableNodes"]  # 216 W + 48 W > 230 W × 0.95

    # A pod whose owner the agents have observed is scored on what its siblings really use.
    pod = make_pod("8")
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "align", "uid": "j", "controller": True}]
    explain = orjson.loads(c.post("/scheduler/explain", data=orjson.dumps({"Pod": pod, "NodeNames": ["green"]})).data)
    assert explain["demand"]["cpu_cores"] == 1.5 and explain["demand"]["basis"] == "observed"

    server.stop()  # Prometheus goes away: no error reaches kube-scheduler, scores age to neutral
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        started = time.perf_counter()
        reply = c.post("/scheduler/prioritize", data=body)
        elapsed = time.perf_counter() - started
        assert reply.status_code == 200 and elapsed < 0.5  # never waits on the dead server
        scores = {h["Host"]: h["Score"] for h in orjson.loads(reply.data)}
        if set(scores.values()) == {5}:
            break
        time.sleep(0.5)
    assert set(scores.values()) == {5}
    text = c.get("/metrics").data.decode()
    assert 'joulesched_extender_profile_source_errors_total{source="prometheus"}' in text
    assert 'joulesched_extender_neutral_scores_total{reason="stale"}' in text


def test_never_reached_prometheus_gives_neutral_scores_and_not_ready() -> None:
    source = PrometheusSource("http://127.0.0.1:9", cache_seconds=1, timeout_seconds=0.5)
    snap = source.snapshot()
    assert not snap.ready and "127.0.0.1:9" in snap.error
    assert len(snap.arrays) == 0 and source.errors == 1


def test_queries_are_valid_promql(prom: tuple[PrometheusServer, ExpositionServer]) -> None:
    server, _ = prom
    for query in profile_queries():
        server.query(query)  # raises on a PromQL syntax error (HTTP 400)
    assert np.isfinite(float(server.wait_for(f"{m.MODEL_IDLE.name}", 2)[0]["value"][1]))


# Two agents' worth of metrics as Prometheus may hold them: every series scraped twice (one agent
# in two jobs, or replicas not deduplicated), a node whose platform power is out (a source of its
# basis is not read), and a site whose carbon intensity is out (its API past max_age_s).
UNEVEN = f"""\
# TYPE {m.NODE_CPU_CORES.name} gauge
{m.NODE_CPU_CORES.name}{{node="lit"}} 64
{m.NODE_CPU_CORES.name}{{node="dark"}} 64
# TYPE {m.NODE_CPU_UTILISATION.name} gauge
{m.NODE_CPU_UTILISATION.name}{{node="lit"}} 0.25
{m.NODE_CPU_UTILISATION.name}{{node="dark"}} 0.25
# TYPE {m.MODEL_IDLE.name} gauge
{m.MODEL_IDLE.name}{{node="lit",device="cpu"}} 60
{m.MODEL_IDLE.name}{{node="dark",device="cpu"}} 60
# TYPE {m.MODEL_PER_CORE.name} gauge
{m.MODEL_PER_CORE.name}{{node="lit",device="cpu"}} 3
{m.MODEL_PER_CORE.name}{{node="dark",device="cpu"}} 3
# TYPE {m.NODE_PLATFORM_POWER.name} gauge
{m.NODE_PLATFORM_POWER.name}{{node="lit",basis="ipmi_dcmi"}} 108
# TYPE {m.NODE_INFO.name} gauge
{m.NODE_INFO.name}{{node="lit",site="north",server_id=""}} 1
{m.NODE_INFO.name}{{node="dark",site="cloudy",server_id=""}} 1
# TYPE {m.SITE_PUE.name} gauge
{m.SITE_PUE.name}{{site="north"}} 1.1
{m.SITE_PUE.name}{{site="cloudy"}} 1.2
# TYPE {m.SITE_CARBON.name} gauge
{m.SITE_CARBON.name}{{site="north"}} 55
"""


def test_what_an_agent_leaves_out_is_unknown_and_a_series_scraped_twice_counts_once(tmp_path: Path) -> None:
    from joulesched.policy.config import PolicyConfig
    from joulesched.policy.demand import PodDemand
    from joulesched.policy.scoring import evaluate

    first, second = ExpositionServer(UNEVEN), ExpositionServer(UNEVEN)
    server = None
    try:
        server = PrometheusServer(tmp_path / "prometheus", [f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}"])
        server.wait_for(m.NODE_PLATFORM_POWER.name, 2)
        server.wait_for(m.SITE_CARBON.name, 2)
        snap = PrometheusSource(server.url, cache_seconds=5).snapshot()
    finally:
        if server is not None:
            server.stop()
        first.close()
        second.close()
    by_name = {p.name: p for p in snap.profiles.nodes}
    lit, dark = by_name["lit"], by_name["dark"]
    assert lit.measured_watts == 108, "the larger of two copies, not their sum"
    assert dark.measured_watts is None and dark.updated is not None and abs(time.time() - dark.updated) < 30, (
        "a node without platform power is still timed, so that it can turn stale"
    )
    assert lit.carbon_intensity == 55 and np.isnan(dark.carbon_intensity), "an absent intensity is unknown, not 0"
    rows = np.arange(len(snap.arrays))
    names = list(snap.arrays.names)
    pod = PodDemand(cpu_cores=1.0)
    carbon = evaluate(snap.arrays, rows, pod, PolicyConfig(strategy="carbon"), time.time())
    energy = evaluate(snap.arrays, rows, pod, PolicyConfig(strategy="energy"), time.time())
    assert carbon.scores[names.index("dark")] == PolicyConfig().neutral_score, "its carbon cannot be known"
    assert energy.scores[names.index("dark")] == 10, "its energy can"


def test_a_scraped_target_that_publishes_the_agents_names_is_not_read_with_the_selector(tmp_path: Path) -> None:
    # A tenant's pod, scraped by the same Prometheus (annotation discovery, its own
    # ServiceMonitor), publishes a power cap of 1 W for "green": without a selector it is read as
    # the agent's and "green" is capped out; with deploy/'s (the agents' job) it is not read.
    agent, tenant = ExpositionServer(AGENTS), ExpositionServer(f"""\
# TYPE {m.NODE_POWER_CAP.name} gauge
{m.NODE_POWER_CAP.name}{{node="green"}} 1
""")
    server = PrometheusServer(tmp_path / "prometheus", [], scrape_configs=[
        {"job_name": "joulesched-agent", "static_configs": [{"targets": [f"127.0.0.1:{agent.port}"]}]},
        {"job_name": "tenant-app", "static_configs": [{"targets": [f"127.0.0.1:{tenant.port}"]}]},
    ])
    try:
        server.wait_for(f'{m.NODE_POWER_CAP.name}{{job="tenant-app"}}', 1)
        server.wait_for(m.SITE_CARBON.name, 2)
        caps = {}
        for selector in ("", 'job="joulesched-agent"'):
            snap = PrometheusSource(server.url, cache_seconds=5, selector=selector).snapshot()
            assert snap.ready and not snap.error, snap.error
            caps[selector] = {p.name: p.power_cap_watts for p in snap.profiles.nodes}
        assert caps[""]["green"] == 1
        assert caps['job="joulesched-agent"'] == {"green": None, "grey": 230}
    finally:
        server.stop()
        agent.close()
        tenant.close()
