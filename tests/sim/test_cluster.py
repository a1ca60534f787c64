"""Cluster specs, sites and carbon series: the shipped example loads, mistakes are named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from joulesched.policy.profile import parse_profiles
from joulesched.sim.carbon import read_hourly_series
from joulesched.sim.cluster import load_cluster, parse_cluster, profile_document
from joulesched.sim.errors import ClusterError

DATA = Path(__file__).parents[2] / "sim" / "data"
CURVE = [100.0 + 10.0 * i for i in range(11)]


def spec(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "sites": {"a": {"pue": 1.2, "carbon_intensity": 100.0}},
        "node_types": [{"name": "t", "count": 2, "site": "a", "cores": 8, "memory": "32Gi", "power_curve_watts": CURVE}],
    }
    doc.update(overrides)
    return doc


def test_the_shipped_example_is_heterogeneous_real_and_multi_site() -> None:
    cluster = load_cluster(DATA / "clusters" / "example.yaml")
    assert cluster.node_count == 20 and len(cluster.node_types) == 7
    means = {name: s.carbon.mean() for name, s in cluster.sites.items()}
    assert means["bpat-hydro"] == pytest.approx(54.7, abs=0.5)
    assert means["miso-coal"] == pytest.approx(440.5, abs=0.5)
    assert cluster.sites["miso-coal"].carbon.filled_hours == 3  # MISO has three empty hours in 2022
    assert cluster.autoscaler.enabled
    assert all(t.source.startswith("SPECpower_ssj2008") for t in cluster.node_types)


def test_nodes_are_listed_round_robin_over_zones_like_the_node_tree() -> None:
    doc = spec(
        sites={"a": {"carbon_intensity": 1}, "b": {"carbon_intensity": 2}},
        node_types=[
            {"name": "x", "count": 3, "site": "a", "cores": 4, "memory": "8Gi", "power_curve_watts": CURVE},
            {"name": "y", "count": 1, "site": "b", "cores": 4, "memory": "8Gi", "power_curve_watts": CURVE},
        ],
    )
    names = [n.name for n in parse_cluster(doc, "c.yaml").nodes()]
    assert names == ["x-000", "y-000", "x-001", "x-002"]


def test_every_problem_is_reported_at_once_with_its_dotted_path() -> None:
    doc = spec(
        sites={"a": {"pue": 0.8, "carbon_intensity": "high"}},
        node_types=[
            {"name": "t", "count": 2, "site": "nowhere", "cores": -4, "memory": "lots", "power_curve_watts": [1, 2, 3]},
            {"name": "u", "count": 1.5, "site": "a", "cores": 4, "memory": 1e9, "power_curve_watts": CURVE[::-1]},
        ],
        autoscaler={"expander": "cheapest"},
    )
    with pytest.raises(ClusterError) as info:
        parse_cluster(doc, "cluster.yaml")
    text = str(info.value)
    for expected in (
        "cluster.yaml:",
        "sites.a.pue: must be >= 1",
        "sites.a.carbon_intensity: must be a number",
        "node_types[0].site: unknown site 'nowhere'",
        "node_types[0].cores: must be > 0",
        "node_types[0].memory:",
        "node_types[0].power_curve_watts: must have 11 entries",
        "node_types[1].count: must be a whole number",
        "node_types[1].power_curve_watts: must not decrease with load",
        "autoscaler.expander: must be one of random, least-waste, priority",
    ):
        assert expected in text, expected


def test_a_linear_power_model_becomes_an_eleven_point_curve() -> None:
    doc = spec(node_types=[{"name": "t", "count": 1, "site": "a", "cores": 10, "memory": "1Gi", "idle_watts": 50, "watts_per_core": 2}])
    curve = parse_cluster(doc, "c.yaml").node_types[0].power_curve_watts
    assert curve[0] == 50 and curve[-1] == 70 and len(curve) == 11


def test_profile_document_is_what_the_extender_reads() -> None:
    cluster = parse_cluster(spec(), "c.yaml")
    nodes = cluster.nodes()
    doc = profile_document(cluster, nodes, [0.25, 0.0], [0.0, 0.0], {"a": 321.0})
    profiles = parse_profiles(doc, "generated")
    assert [p.name for p in profiles.nodes] == ["t-000", "t-001"]
    first = profiles.nodes[0]
    assert (first.utilisation, first.carbon_intensity, first.pue, first.updated) == (0.25, 321.0, 1.2, None)


# -- carbon series --------------------------------------------------------------------------------


def write_series(tmp_path: Path, values: list[str], start: str = "2022-01-01 00:00:00+00:00") -> Path:
    from datetime import datetime, timedelta

    t0 = datetime.fromisoformat(start)
    rows = ["timestamp,WND,avg_CI"] + [f"{(t0 + timedelta(hours=k)).isoformat(sep=' ')},1,{v}" for k, v in enumerate(values)]
    path = tmp_path / "series.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_hourly_integral_is_exact_across_hour_boundaries(tmp_path: Path) -> None:
    path = write_series(tmp_path, ["100", "300", "200"])
    origin = float(read_hourly_series(path).source.starts[0])  # simulated t = 0 at the first hour
    series = read_hourly_series(path, offset=origin)
    # from 00:30 to 01:30: half an hour at 100 and half an hour at 300
    assert series.integral(1800.0, 5400.0) == pytest.approx(100 * 1800 + 300 * 1800)
    assert series.at(3600.0) == 300.0
    # past the end the year repeats: hour 3 is hour 0 again
    assert series.at(3 * 3600.0 + 10) == 100.0
    assert series.integral(0.0, 4 * 3600.0) == pytest.approx((100 + 300 + 200 + 100) * 3600)


@pytest.mark.parametrize(
    ("missing", "filled"),
    [("interpolate", 200.0), ("previous", 100.0)],
    ids=["an empty hour is interpolated", "or carries the last value"],
)
def test_empty_hours_are_handled_as_configured(tmp_path: Path, missing: str, filled: float) -> None:
    path = write_series(tmp_path, ["100", "", "300"])
    series = read_hourly_series(path, missing=missing)
    assert series.source.values[1] == filled and series.filled_hours == 1


def test_empty_hours_can_be_an_error_naming_the_line(tmp_path: Path) -> None:
    path = write_series(tmp_path, ["100", "", "300"])
    with pytest.raises(ClusterError, match=r"line 3: field 'avg_CI': empty"):
        read_hourly_series(path, missing="error")


def test_a_gap_in_the_hours_is_named(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("timestamp,avg_CI\n2022-01-01 00:00:00+00:00,1\n2022-01-01 02:00:00+00:00,2\n", encoding="utf-8")
    with pytest.raises(ClusterError, match="line 3: field 'timestamp'"):
        read_hourly_series(path)


def test_a_site_series_file_problem_names_the_site(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("timestamp,avg_CI\n2022-01-01 00:00:00+00:00,minus\n", encoding="utf-8")
    doc = spec(sites={"a": {"carbon_series": {"file": str(path)}}})
    with pytest.raises(ClusterError, match=r"sites\.a\.carbon_series\.file: .*line 2: field 'avg_CI'"):
        parse_cluster(doc, "c.yaml")


def test_a_site_without_carbon_data_is_a_problem_not_zero_grams() -> None:
    # The simulator reports every policy's carbon: 0 g/kWh for a site nobody gave would make it
    # the cleanest, and the carbon policy's figures invented.
    with pytest.raises(ClusterError) as caught:
        parse_cluster(spec(sites={"a": {"pue": 1.2}}), "c.yaml")
    assert "sites.a: give carbon_intensity (gCO2e/kWh) or carbon_series" in caught.value.problems


def test_the_shipped_series_start_at_the_cluster_start() -> None:
    cluster = load_cluster(DATA / "clusters" / "example.yaml")
    bpat = cluster.sites["bpat-hydro"].carbon
    rows = (DATA / "carbon" / "eia_2022_BPAT_hourly.csv").read_text(encoding="utf-8").splitlines()
    june_first = next(r for r in rows if r.startswith("2022-06-01 00:00"))
    assert bpat.at(0.0) == pytest.approx(float(june_first.split(",")[1]))
    assert np.isfinite(bpat.source.values).all()


SITES_ONLY = {"lab": {"carbon_intensity": 100}}
ONE_TYPE = {"name": "n", "count": 2, "site": "lab", "cores": 8, "memory": "32Gi", "idle_watts": 50, "watts_per_core": 5}


@pytest.mark.parametrize("node_types", [[], None], ids=["an empty list", "null"])
def test_a_cluster_without_node_types_is_refused(node_types: object) -> None:
    with pytest.raises(ClusterError, match="node_types"):
        parse_cluster({"name": "c", "sites": SITES_ONLY, "node_types": node_types}, "c.yaml")


def test_an_autoscaler_block_with_every_default_is_on() -> None:
    """docs/sim.md: present = enabled unless enabled: false."""
    assert parse_cluster({"name": "c", "sites": SITES_ONLY, "node_types": [ONE_TYPE], "autoscaler": {}}, "c.yaml").autoscaler.enabled
    assert not parse_cluster({"name": "c", "sites": SITES_ONLY, "node_types": [ONE_TYPE]}, "c.yaml").autoscaler.enabled


def test_gpus_described_without_a_count_are_refused_not_dropped() -> None:
    nt = {**ONE_TYPE, "gpus": {"idle_watts": 60, "max_watts": 400, "model": "A100"}}
    with pytest.raises(ClusterError, match=r"gpus.count: is required with idle_watts, max_watts, model"):
        parse_cluster({"name": "c", "sites": SITES_ONLY, "node_types": [nt]}, "c.yaml")
