"""``--record``: every sample as a JSON line the simulator can replay."""

from __future__ import annotations

import gzip
import json
import stat
from pathlib import Path

import pytest

from joulesched.measurement.config import AgentConfig, SourcesConfig
from joulesched.measurement.exporters.record import FORMAT, RecordingWriter, load_recording, read_lines
from joulesched.measurement.sampler import Sampler
from joulesched.measurement.sources.base import Roots
from joulesched.measurement.sources.cgroup_cpu import CgroupCpu
from joulesched.measurement.sources.procfs_stat import ProcStat
from joulesched.measurement.sources.registry import open_sources
from tests.measurement.fakes import FakeClock
from tests.measurement.replica import CgroupTree, PowercapTree, ProcTree

POD = "aaaaaaaa-0000-4000-8000-000000000001"


@pytest.mark.parametrize("name", ["samples.jsonl", "samples.jsonl.gz"], ids=["plain", "gzip"])
def test_recording_round_trip(
    tmp_path: Path,
    roots: Roots,
    clock: FakeClock,
    powercap: PowercapTree,
    cgroup: CgroupTree,
    proc: ProcTree,
    name: str,
) -> None:
    powercap.server(sockets=1)
    cgroup.add_pod(POD, "burstable", 0.0, 500)
    config = AgentConfig(roots=roots, sources=SourcesConfig(order=("rapl_sysfs",)))
    sampler = Sampler(
        config,
        open_sources(("rapl_sysfs",), {}, roots, clock).sources,
        node="n1",
        clock=clock,
        cgroups=CgroupCpu(roots.cgroup),
        procstat=ProcStat(roots.procfs),
    )
    path = tmp_path / name
    writer = RecordingWriter(str(path), flush_every=2)
    writer.write(sampler.sample())
    for i in range(1, 6):
        clock.tick()
        powercap.advance("intel-rapl:0", 80.0 + i)
        powercap.advance("intel-rapl:0:1", 8.0)
        cgroup.set_cpu(POD, 0.5 * i)
        proc.set_stat(1.0 * i, 7.0 * i)
        writer.write(sampler.sample())
    writer.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    rec = load_recording(str(path))
    assert (
        rec.header["format"] == FORMAT
        and rec.header["node"] == "n1"
        and rec.header["domains"] == ["cpu", "dram", "gpu", "other"]
    )
    assert set(rec.zones) == {"rapl_sysfs/package-0", "rapl_sysfs/core-0", "rapl_sysfs/dram-0"}
    assert rec.pods[POD]["qos"] == "burstable"
    assert len(rec.samples) == 5
    last = rec.samples[-1]
    assert last["node_j"] == pytest.approx(93.0) and last["domains"][:2] == pytest.approx([85.0, 8.0])
    for sample in rec.samples:  # conservation survives the rounding to micro-units
        parts = sum(sum(v[1:]) for v in sample["pods"].values()) + sum(sum(v) for v in sample["buckets"].values())
        assert parts == pytest.approx(sample["node_j"], abs=1e-5)
    assert last["pods"][POD][0] == pytest.approx(0.5)


def test_a_truncated_last_line_is_tolerated_but_not_a_broken_middle(tmp_path: Path) -> None:
    header = json.dumps({"type": "header", "format": FORMAT, "version": 1, "node": "n"})
    good = tmp_path / "cut.jsonl"
    good.write_text(header + "\n" + '{"type":"sample","t":1}\n{"type":"sam')
    assert len(load_recording(str(good)).samples) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(header + "\n{oops\n" + '{"type":"sample","t":1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not JSON"):
        list(read_lines(str(bad)))


def test_not_a_recording(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write('{"type":"sample"}\n')
    with pytest.raises(ValueError, match="not a joulesched-recording"):
        load_recording(str(path))
