"""The Prometheus exposition: golden file, promtool, names from measurement.names, generated docs.

Update the golden file after an intended change with::

    UPDATE_GOLDEN=1 python -m pytest tests/measurement/test_exposition.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from joulesched.contracts import docgen, names
from joulesched.measurement.exporters.prometheus import families, make_registry
from joulesched.measurement.snapshot import (
    GpuSummary,
    ModelSnapshot,
    PodSnapshot,
    Snapshot,
    SourceSnapshot,
    ZoneSnapshot,
)

GOLDEN = Path(__file__).parent / "golden" / "agent_metrics.prom"


def golden_snapshot() -> Snapshot:
    zones = (
        ZoneSnapshot("rapl_sysfs", "package-0", "package", "counter", None, 262143.32885, 81234.5, 102.5, True),
        ZoneSnapshot("rapl_sysfs", "core-0", "core", "counter", "package-0", 262143.32885, 60123.25, 75.0, True),
        ZoneSnapshot("rapl_sysfs", "dram-0", "dram", "counter", None, 65712.999613, 9876.5, 12.25, True),
        ZoneSnapshot("rapl_sysfs", "package-1", "package", "counter", None, 262143.32885, 512.0, None, False),
        ZoneSnapshot("ipmi_dcmi", "chassis", "platform", "power", None, None, 180000.0, 320.0, True, 4480.0),
        ZoneSnapshot("nvml", "gpu-0", "gpu", "counter", None, None, 50000.0, 250.0, True),
    )
    pods = (
        PodSnapshot(
            "0f6b1d7e-3c2a-4b59-9e4e-0a8d7c6b5a41",
            "default",
            "web-7d4b9c-x2x",
            "burstable",
            "Deployment",
            "web",
            500.0,
            1234.5,
            {"cpu": 1000.0, "dram": 100.0, "gpu": 0.0, "other": 900.0},
            True,
        ),
        PodSnapshot(
            "5d2e8c1f-7a6b-4c3d-8e9f-1a2b3c4d5e6f",
            "",
            "5d2e8c1f-7a6b-4c3d-8e9f-1a2b3c4d5e6f",
            "besteffort",
            "",
            "",
            1.953125,
            2.0,
            {"cpu": 3.0, "dram": 0.25, "gpu": 4000.0, "other": 2.75},
            False,
        ),
    )
    sources = (
        SourceSnapshot(
            "rapl_sysfs",
            True,
            "",
            (10, 90, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100),
            0.0625,
            100,
            0,
        ),
        # one read ran into ipmitool's 15 s timeout
        SourceSnapshot(
            "ipmi_dcmi", False, "timeout", (0, 0, 0, 0, 0, 0, 0, 50, 90, 99, 99, 99, 99, 99, 100, 100, 100), 27.5, 100, 3
        ),
    )
    return Snapshot(
        node="node-a",
        seq=42,
        time=1_764_400_000.0,
        interval_seconds=1.0,
        idle_policy="requests",
        cpus=64,
        utilisation=0.25,
        basis="ipmi_dcmi+nvml",
        sources_used=("ipmi_dcmi", "rapl_sysfs", "nvml"),
        zones=zones,
        sources=sources,
        node_energy_total={"ipmi_dcmi+nvml": 230000.0, "rapl_sysfs+nvml": 1500.0},
        node_power_watts=570.0,
        domain_energy_total={"cpu": 81000.0, "dram": 9800.0, "gpu": 50000.0, "other": 90700.0},
        buckets_total={
            "idle": {"cpu": 5000.0, "dram": 500.0, "gpu": 40000.0, "other": 4500.0},
            "system": {"cpu": 250.0, "dram": 25.0, "gpu": 10.0, "other": 225.0},
        },
        busy_cpu_seconds_total=98765.4,
        pods=pods,
        models=(ModelSnapshot("cpu", 180.5, 3.25, 0.97, 900), ModelSnapshot("gpu-0", 60.0, 640.0, 0.91, 300)),
        anomalies=(("rapl_sysfs", "package-0", "implausible", 2),),
        ratios={"rapl_sysfs/ipmi_dcmi": 0.5},
        gpus=GpuSummary(1, 60.0, 700.0, 0.35),
        owners=(("default", "Deployment", "web", 0.75),),
        windows_open=1,
        server_id="srv-0042",
        site="dc-north",
        speed=1.2,
        power_cap_watts=900.0,
    )


def exposition() -> bytes:
    snap = golden_snapshot()
    return generate_latest(make_registry(lambda: snap))


def test_exposition_matches_the_golden_file() -> None:
    text = exposition()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_bytes(text)
    assert GOLDEN.exists(), f"no golden file: run UPDATE_GOLDEN=1 pytest {__file__}"
    assert text.decode() == GOLDEN.read_text(), "exposition changed: diff it, then UPDATE_GOLDEN=1 if intended"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: apt install prometheus)")
def test_promtool_accepts_the_exposition(tmp_path: Path) -> None:
    result = subprocess.run(["promtool", "check", "metrics"], input=exposition(), capture_output=True, timeout=60)
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
    assert not result.stdout.strip() and not result.stderr.strip(), (result.stdout + result.stderr).decode()


def test_every_family_is_declared_in_names_with_its_type_and_labels() -> None:
    declared = {m.name: m for m in names.METRICS}
    for family in families(golden_snapshot()):
        full = family.name + ("_total" if family.type == "counter" else "")
        assert full in declared, f"{full} is not in measurement.names"
        metric = declared[full]
        assert family.type == metric.type
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == set(metric.labels), (full, sample.labels)


def test_the_exposition_parses_back() -> None:
    parsed = {f.name: f for f in text_string_to_metric_families(exposition().decode())}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for s in parsed["joulesched_node_energy_joules"].samples
    }
    assert (
        samples[
            (
                "joulesched_node_energy_joules_total",
                (("node", "node-a"), ("source", "rapl_sysfs"), ("zone", "package-0")),
            )
        ]
        == 81234.5
    )


def test_openmetrics_is_served_too() -> None:
    snap = golden_snapshot()
    text = generate_openmetrics(make_registry(lambda: snap)).decode()
    assert text.endswith("# EOF\n")
    assert "joulesched_pod_energy_joules_total{" in text


def test_no_snapshot_yet_exposes_nothing() -> None:
    assert generate_latest(make_registry(lambda: None)) == b""


def test_metric_docs_are_generated_from_names() -> None:
    assert docgen.main(["--check"]) == 0, "docs/metrics.md is stale: run python -m joulesched.contracts.docgen"
    text = docgen.DOC.read_text()
    for metric in names.METRICS:
        assert f"`{metric.name}`" in text


def test_metric_names_follow_the_conventions() -> None:
    for metric in names.METRICS:
        if metric.type == "counter":
            assert metric.name.endswith("_total"), metric.name
        if "_joules" in metric.name:
            assert metric.type == "counter", metric.name
        assert names.L_ZONE not in metric.name.removeprefix("joulesched_").split("_")[:1]
    assert len({m.name for m in names.METRICS}) == len(names.METRICS)


def test_only_the_domains_a_node_has_are_exported() -> None:
    snap = replace(golden_snapshot(), domains=("cpu", "dram"))  # RAPL alone: no GPU, no "other"
    text = generate_latest(make_registry(lambda: snap)).decode()
    pod_lines = [line for line in text.splitlines() if line.startswith("joulesched_pod_energy_joules_total{")]
    assert len(pod_lines) == 2 * len(snap.pods)
    assert not any('domain="gpu"' in line or 'domain="other"' in line for line in pod_lines)


def test_discarded_intervals_are_exported_by_kind() -> None:
    snap = replace(golden_snapshot(), discarded=(("rapl_sysfs", "package-0", "reset", 17.0),))
    text = generate_latest(make_registry(lambda: snap)).decode()
    assert 'joulesched_energy_discarded_seconds_total{kind="reset",source="rapl_sysfs",zone="package-0"} 17.0' in text


def test_estimated_energy_and_seconds_are_exported_apart_from_measured() -> None:
    snap = replace(golden_snapshot(), estimated=(("ipmi_dcmi", "chassis", "gap", 14.0),))
    text = generate_latest(make_registry(lambda: snap)).decode()
    assert 'joulesched_energy_estimated_seconds_total{kind="gap",source="ipmi_dcmi",zone="chassis"} 14.0' in text
    assert (
        'joulesched_node_energy_estimated_joules_total{node="node-a",source="ipmi_dcmi",zone="chassis"} 4480.0' in text
    )
    assert 'joulesched_node_energy_joules_total{node="node-a",source="ipmi_dcmi",zone="chassis"} 180000.0' in text


def test_the_prometheus_source_reads_the_gpus_as_the_agents_profile_document_gives_them() -> None:
    # Two ways a node's profile reaches the extender: Prometheus scraping this exposition, and
    # the agent's /v1/profile (the file source). Both give the GPUs of one GpuSummary. Before,
    # the Prometheus source looked for a model of device "gpu", which the agent exports per
    # GPU ("gpu-0", ...), and read every GPU's idle power as 0 W.
    from prometheus_client.parser import text_string_to_metric_families

    from joulesched.extender.profiles import profiles_from_samples
    from joulesched.measurement.exporters.profile import profile_document
    from joulesched.policy.profile import parse_profiles

    snap = golden_snapshot()
    assert snap.gpus is not None and snap.gpus.idle_watts > 0
    values = [
        {"metric": {"__name__": s.name, **s.labels}, "value": [snap.time, str(s.value)]}
        for family in text_string_to_metric_families(exposition().decode())
        for s in family.samples
    ]
    measured = [{"metric": {"node": snap.node}, "value": [snap.time, str(snap.time)]}]
    scraped, skipped = profiles_from_samples(values, measured)
    assert not skipped
    (node,) = scraped.nodes
    (documented,) = parse_profiles(profile_document(snap), "agent /v1/profile").nodes
    assert node.gpus == documented.gpus
    assert node.gpus is not None and node.gpus.idle_watts == snap.gpus.idle_watts


def test_a_gpu_node_whose_gpu_power_is_not_known_yet_is_read_by_both_sources() -> None:
    """Before NVML gives a power limit or a power sample, the GPUs' maximum is 0 W: the Prometheus
    source took it, and the file source refused the agent's whole document."""
    import dataclasses

    from joulesched.measurement.exporters.profile import profile_document
    from joulesched.measurement.snapshot import GpuSummary
    from joulesched.policy.profile import parse_profiles

    snap = dataclasses.replace(golden_snapshot(), gpus=GpuSummary(2, 0.0, 0.0, 0.0))
    (node,) = parse_profiles(profile_document(snap), "agent /v1/profile").nodes
    assert node.gpus is not None and (node.gpus.count, node.gpus.max_watts) == (2, 0.0)
