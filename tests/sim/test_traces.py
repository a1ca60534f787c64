"""Trace readers: real files parse, and a malformed file is rejected naming file, record and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from joulesched.sim.errors import TraceError
from joulesched.sim.model import Workload, topological_order
from joulesched.sim.traces import (
    read_nextflow_trace,
    read_openb_nodes,
    read_openb_pods,
    read_pod_csv,
    read_trace,
    read_wfformat,
)
from joulesched.sim.traces.nextflow import parse_duration, parse_memory
from joulesched.sim.traces.synthetic import (
    PUBLISHED_SHAPES,
    independent_pods,
    workflow_shape,
    write_pod_csv,
    write_wfformat,
)
from joulesched.sim.traces.wfformat import cpu_request_from_avg

FIXTURES = Path(__file__).with_name("fixtures")
SHIPPED = Path(__file__).parents[2] / "sim" / "data" / "workflows"
MIB = 1024**2


def wf_doc(tasks: list[dict[str, Any]], execution: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec = [{"name": t["id"], "id": t["id"], "parents": t.get("parents", []), "children": []} for t in tasks]
    exe = execution if execution is not None else [{k: v for k, v in t.items() if k != "parents"} for t in tasks]
    return {"name": "wf", "schemaVersion": "1.5", "workflow": {"specification": {"tasks": spec}, "execution": {"tasks": exe}}}


def write_json(tmp_path: Path, doc: Any, name: str = "wf.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


# -- WfFormat -------------------------------------------------------------------------------------


def test_every_shipped_nf_core_instance_parses_with_its_dag() -> None:
    files = sorted(SHIPPED.glob("*.json"))
    assert len(files) == 11
    for path in files:
        trace = read_wfformat(path)
        assert trace.pods and all(p.workflow == path.stem for p in trace.pods)
        assert topological_order(trace.pods) is not None
        assert all(p.cpu_request >= 1 and p.duration >= 1.0 for p in trace.pods)


def test_rnaseq_has_the_recorded_task_count_and_roots() -> None:
    trace = read_wfformat(SHIPPED / "rnaseq-dirt02-001.json")
    assert len(trace.pods) == 197
    assert sum(1 for p in trace.pods if not p.parents) == 15


@pytest.mark.parametrize(
    ("avg_cpu", "cores"),
    [(5.0, 1.0), (94.0, 1.0), (110.0, 1.0), (111.0, 2.0), (157.0, 2.0), (352.0, 4.0)],
    ids=["nearly idle asks one core", "one busy core", "10 % tolerance", "just over", "one and a half", "three and a half"],
)
def test_cpu_request_is_avg_cpu_rounded_up_with_tolerance(avg_cpu: float, cores: float) -> None:
    assert cpu_request_from_avg(avg_cpu) == cores


def test_derived_requests_usage_memory_and_floor(tmp_path: Path) -> None:
    doc = wf_doc(
        [
            {"id": "a", "runtimeInSeconds": 0.0, "avgCPU": 157.0, "memoryInBytes": 3 * MIB + 1},
            {"id": "b", "parents": ["a"], "runtimeInSeconds": 12.5, "avgCPU": 50.0},
        ]
    )
    trace = read_wfformat(write_json(tmp_path, doc))
    a, b = trace.pods
    assert (a.cpu_request, a.cpu_usage, a.memory_request, a.duration) == (2.0, 1.57, 4 * MIB, 1.0)
    assert (b.cpu_request, b.cpu_usage, b.memory_request, b.duration, b.parents) == (1.0, 0.5, 0.0, 12.5, (0,))
    assert any("raised to 1 s" in n for n in trace.notes)


def test_core_count_is_the_request_when_the_trace_has_it() -> None:
    trace = read_wfformat(Path(__file__).parents[2] / "sim" / "data" / "workflows" / "bacass-dirt02-001.json")
    assert all(p.cpu_request >= 1 for p in trace.pods)
    makeflow = {"id": "t", "runtimeInSeconds": 5.0, "avgCPU": 180.0, "coreCount": 4}
    doc = wf_doc([makeflow])
    assert read_wfformat_from(doc).pods[0].cpu_request == 4.0


def read_wfformat_from(doc: Any) -> Any:
    from joulesched.sim.traces.wfformat import parse_wfformat

    return parse_wfformat(doc, "inline.json")


@pytest.mark.parametrize(
    ("doc", "record", "field"),
    [
        (wf_doc([{"id": "a", "avgCPU": 50}]), "task 'a'", "runtimeInSeconds"),
        (wf_doc([{"id": "a", "runtimeInSeconds": "ten"}]), "task 'a'", "runtimeInSeconds"),
        (wf_doc([{"id": "a", "runtimeInSeconds": 1, "avgCPU": -5}]), "task 'a'", "avgCPU"),
        (wf_doc([{"id": "a", "runtimeInSeconds": 1, "memoryInBytes": True}]), "task 'a'", "memoryInBytes"),
        (wf_doc([{"id": "a", "runtimeInSeconds": 1, "parents": ["ghost"]}]), "task 'a'", "parents"),
        (wf_doc([{"id": "a", "runtimeInSeconds": 1}], execution=[]), "task 'a'", "runtimeInSeconds"),
        (wf_doc([{"id": "a", "runtimeInSeconds": 1, "parents": ["b"]}, {"id": "b", "runtimeInSeconds": 1, "parents": ["a"]}]), "", "parents"),
        ({"name": "x"}, "", "workflow"),
    ],
    ids=[
        "a task without a runtime",
        "a runtime that is a string",
        "a negative average CPU",
        "a boolean memory",
        "a parent that does not exist",
        "a task that never ran",
        "a cycle",
        "not WfFormat at all",
    ],
)
def test_malformed_wfformat_names_file_record_and_field(tmp_path: Path, doc: Any, record: str, field: str) -> None:
    path = write_json(tmp_path, doc, "broken.json")
    with pytest.raises(TraceError) as info:
        read_wfformat(path)
    err = info.value
    assert err.path == str(path) and err.field == field and err.record == record
    assert str(path) in str(err) and field in str(err)


def test_wfformat_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(TraceError, match=r"bad\.json: not valid JSON"):
        read_wfformat(path)


# -- Nextflow trace.txt ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("3.4s", 3.4), ("1m 2s", 62.0), ("1h 2m 3s", 3723.0), ("500ms", 0.5), ("2d 1h", 176400.0), ("1500", 1.5)],
    ids=["decimal seconds", "minutes and seconds", "hours", "milliseconds", "days", "raw milliseconds"],
)
def test_nextflow_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [("1.2 GB", 1.2 * 1024**3), ("512 MB", 512 * MIB), ("12 KB", 12 * 1024), ("0", 0.0), ("4096", 4096.0)],
    ids=["gigabytes are binary", "megabytes", "kilobytes", "zero", "raw bytes"],
)
def test_nextflow_memory(text: str, nbytes: float) -> None:
    assert parse_memory(text) == pytest.approx(nbytes)


@pytest.mark.parametrize("text", ["1x", "ten seconds", "1m 2"])
def test_nextflow_duration_rejects_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_nextflow_trace_fixture() -> None:
    trace = read_nextflow_trace(FIXTURES / "nextflow-rnaseq-trace.txt")
    assert len(trace.pods) == 6  # the CACHED task did not run here
    by_id = {p.name.rsplit("/", 1)[-1]: p for p in trace.pods}
    fastqc = by_id["2"]
    assert fastqc.arrival == pytest.approx(34.002 - 29.882)
    assert (fastqc.duration, fastqc.cpu_request, fastqc.cpu_usage) == (62.0, 2.0, pytest.approx(1.875))
    assert fastqc.memory_request == pytest.approx(6 * 1024**3)
    assert fastqc.process == "FASTQC"
    assert by_id["5"].duration == 1.0  # 400 ms, floored; FAILED tasks ran and used energy
    assert by_id["6"].duration == 3722.0
    assert any("CACHED" in n for n in trace.notes)


def test_nextflow_trace_with_a_bad_duration_names_line_task_and_column(tmp_path: Path) -> None:
    lines = (FIXTURES / "nextflow-rnaseq-trace.txt").read_text(encoding="utf-8").splitlines()
    lines[2] = lines[2].replace("1m 2s", "1m 2x")
    path = tmp_path / "trace.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(TraceError) as info:
        read_nextflow_trace(path)
    assert info.value.record.startswith("line 3 (task 'NFCORE_RNASEQ:RNASEQ:FASTQC")
    assert info.value.field == "realtime"


def test_nextflow_trace_without_a_needed_column(tmp_path: Path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text("task_id\tname\tstatus\n1\tA\tCOMPLETED\n", encoding="utf-8")
    with pytest.raises(TraceError, match="realtime"):
        read_nextflow_trace(path)


# -- pod CSV and openb ----------------------------------------------------------------------------


def test_generic_pod_csv() -> None:
    trace = read_pod_csv(FIXTURES / "pods.csv")
    pods = {p.name: p for p in trace.pods}
    assert pods["web-1"].cpu_request == 0.5 and pods["web-1"].memory_request == 1024**3 and pods["web-1"].group == "web"
    assert pods["etl-load"].parents == (2,) and pods["etl-load"].namespace == "batch"
    assert (pods["train-1"].gpu_request, pods["train-1"].gpu_usage, pods["train-1"].priority) == (1, 0.9, 10)
    best = pods["best-effort"]
    assert (best.cpu_request, best.memory_request, best.cpu_usage) == (0.0, 0.0, 0.1)


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ("a,0,10,lots,,,,,,,,,,", "cpu_request"),
        ("a,0,-10,1,,,,,,,,,,", "duration"),
        ("a,zero,10,1,,,,,,,,,,", "arrival"),
        ("a,0,10,1,,1.5,,,,,,,,", "gpu_request"),
        ("a,0,10,1,,,,1.5,,,,,,", "gpu_usage"),
        ("a,0,10,1,,,,,,,,,,ghost", "parents"),
    ],
    ids=["a CPU that is not a quantity", "a negative duration", "an arrival that is a word", "half a GPU", "a GPU busier than 100 %", "an unknown parent"],
)
def test_malformed_pod_csv_names_line_pod_and_field(tmp_path: Path, row: str, field: str) -> None:
    header = (FIXTURES / "pods.csv").read_text(encoding="utf-8").splitlines()[0]
    path = tmp_path / "pods.csv"
    path.write_text(f"{header}\n{row}\n", encoding="utf-8")
    with pytest.raises(TraceError) as info:
        read_pod_csv(path)
    assert info.value.field == field
    assert info.value.record == "line 2 (pod 'a')"
    assert str(path) in str(info.value)


def test_pod_csv_with_an_unknown_column(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("arrival,duration,colour\n0,1,red\n", encoding="utf-8")
    with pytest.raises(TraceError, match="colour"):
        read_pod_csv(path)


def test_openb_pods_and_nodes() -> None:
    trace = read_openb_pods(FIXTURES / "openb_pod_list_sample.csv")
    first = trace.pods[0]
    assert (first.name, first.cpu_request, first.memory_request, first.gpu_request) == ("openb-pod-0000", 12.0, 16384 * MIB, 1)
    assert first.duration == 12537496.0 and first.priority == 1  # LS (latency-sensitive) pods come first
    assert read_trace(FIXTURES / "openb_pod_list_sample.csv").kind == "openb"
    nodes = read_openb_nodes(FIXTURES / "openb_node_list_sample.csv")
    assert nodes[0].cpu_cores == 32.0 and nodes[-1].gpus == 2 and nodes[-1].gpu_model == "P100"


def test_openb_pod_deleted_before_it_was_scheduled(tmp_path: Path) -> None:
    lines = (FIXTURES / "openb_pod_list_sample.csv").read_text(encoding="utf-8").splitlines()
    lines[1] = "openb-pod-0000,12000,16384,1,1000,,LS,Running,100,50,100"
    path = tmp_path / "openb_pods.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(TraceError) as info:
        read_openb_pods(path)
    assert (info.value.record, info.value.field) == ("line 2 (pod 'openb-pod-0000')", "deletion_time")


@pytest.mark.skipif(not Path("../shared/data/pods/openb_pod_list_default.csv").exists(), reason="../shared/data is not here")
def test_the_whole_openb_trace_parses() -> None:
    trace = read_trace("../shared/data/pods/openb_pod_list_default.csv")
    assert len(trace.pods) == 8152 - 897  # every pod except those never scheduled
    assert len(read_openb_nodes("../shared/data/pods/openb_node_list_all_node.csv")) == 1523


def test_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\n", encoding="utf-8")
    with pytest.raises(TraceError, match="unknown trace format"):
        read_trace(path)


# -- the generator --------------------------------------------------------------------------------


def test_published_shapes_have_their_sizes_and_are_deterministic() -> None:
    for name, shape in PUBLISHED_SHAPES.items():
        trace = workflow_shape(name, shape, seed=3)
        assert len(trace.pods) == shape.tasks
        assert trace == workflow_shape(name, shape, seed=3)
        order = topological_order(trace.pods)
        assert order is not None
        end = [0.0] * len(trace.pods)
        for i in order:
            end[i] = max((end[j] for j in trace.pods[i].parents), default=0.0) + trace.pods[i].duration
        assert 0.5 * shape.makespan <= max(end) <= shape.makespan + 1e-6


def test_generated_traces_round_trip_through_the_readers(tmp_path: Path) -> None:
    wf = workflow_shape("quantms-shape", PUBLISHED_SHAPES["quantms-shape"], seed=1)
    write_wfformat(wf, tmp_path / "q.json")
    back = read_trace(tmp_path / "q.json")
    assert [p.parents for p in back.pods] == [p.parents for p in wf.pods]
    assert [p.cpu_request for p in back.pods] == [p.cpu_request for p in wf.pods]
    assert [p.duration for p in back.pods] == pytest.approx([max(p.duration, 1.0) for p in wf.pods])
    pods = independent_pods(50, cluster_cores=64, seed=2)
    write_pod_csv(pods, tmp_path / "p.csv")
    again = read_trace(tmp_path / "p.csv")
    assert [(p.arrival, p.duration, p.cpu_request, p.cpu_usage) for p in again.pods] == [
        (p.arrival, p.duration, p.cpu_request, p.cpu_usage) for p in pods.pods
    ]


def test_workload_resolves_parents_across_traces() -> None:
    a = workflow_shape("a", PUBLISHED_SHAPES["rnaseq-shape"], seed=0)
    b = workflow_shape("b", PUBLISHED_SHAPES["rnaseq-shape"], seed=0)
    wl = Workload.of([a, b])
    n = len(a.pods)
    assert wl.pods[n + 1].parents == tuple(n + p for p in b.pods[1].parents)
    assert wl.workflows == ("a", "b")


def test_openb_gpu_spec_is_the_gpu_models_a_pod_accepts(tmp_path: Path) -> None:
    lines = (FIXTURES / "openb_pod_list_sample.csv").read_text(encoding="utf-8").splitlines()
    lines[1] = "openb-pod-0000,12000,16384,1,1000,V100M16|V100M32,LS,Running,0,500,100"
    path = tmp_path / "openb_pod_list_spec.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    pods = read_openb_pods(path).pods
    assert pods[0].gpu_models == ("V100M16", "V100M32")
    assert all(p.gpu_models == () for p in pods[1:])


def test_pod_csv_gpu_model_column(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("name,arrival,duration,gpu_request,gpu_model\ntrain,0,60,1,A100|H100\n", encoding="utf-8")
    assert read_pod_csv(path).pods[0].gpu_models == ("A100", "H100")
    path.write_text("name,arrival,duration,gpu_request,gpu_model\ncpu-only,0,60,0,A100\n", encoding="utf-8")
    with pytest.raises(TraceError) as info:
        read_pod_csv(path)
    assert info.value.field == "gpu_model"


def test_wfformat_1_4_parents_name_tasks_by_name_not_by_their_short_id(tmp_path: Path) -> None:
    """In WfFormat 1.4 (pegasus-instances, makeflow-instances) `name` is required, `id` an optional
    short one ("ID0000001"), and parents list names ("mProject_ID0000001")."""
    doc = {"schemaVersion": "1.4", "workflow": {"tasks": [
        {"name": "mProject_ID0000001", "id": "ID0000001", "type": "compute", "parents": [],
         "runtimeInSeconds": 15.712, "avgCPU": 99.9, "cores": 1},
        {"name": "mDiffFit_ID0000008", "id": "ID0000008", "type": "compute",
         "parents": ["mProject_ID0000001"], "runtimeInSeconds": 1.2, "avgCPU": 90.0, "cores": 1},
        {"name": "mConcatFit_ID0000009", "type": "compute",
         "parents": ["mDiffFit_ID0000008", "mProject_ID0000001"], "runtimeInSeconds": 3.0, "avgCPU": 50.0, "cores": 1},
    ]}}
    path = tmp_path / "montage-1.4.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert [p.parents for p in read_wfformat(path).pods] == [(), (0,), (1, 0)]


def test_a_nextflow_trace_whose_last_column_is_status_is_recognised(tmp_path: Path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text("task_id\tname\trealtime\tsubmit\tstatus\n1\tFOO (a)\t2s\t2023-03-21 21:10:29.882\tCOMPLETED\n")
    assert len(read_trace(path).pods) == 1


def test_errors_name_the_files_own_line_and_the_rows_real_field_count(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("name,arrival,duration\na,0,10\n\nb,1,ten\n")  # 'ten' is on line 4
    with pytest.raises(TraceError) as info:
        read_trace(pods)
    assert info.value.record.startswith("line 4")
    trace = tmp_path / "trace.txt"
    trace.write_text("task_id\tname\trealtime\tsubmit\tstatus\n1\tFOO (a)\t2s\tCOMPLETED\n")  # 4 fields of 5
    with pytest.raises(TraceError, match="line 2: has 4 fields, the header has 5"):
        read_trace(trace)
