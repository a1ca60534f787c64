"""``POST /v1/weblog``: Nextflow's ``-with-weblog`` events open and close one window per run.

``golden/nextflow_weblog_hello.jsonl`` is an event sequence of ``nextflow run hello`` (two tasks)
built field for field as nf-weblog's ``WebLogObserver.sendHttpMessage`` writes it (``runName``,
``runId``, ``event``, ``utcTime``, and ``metadata`` {parameters, workflow} or ``trace``: the
task's trace record); it is not captured from a live run.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

from joulesched.measurement.clock import SteadyClock
from tests.measurement.agent_server_support import Running, start
from tests.support import Clock

EVENTS = [
    json.loads(line)
    for line in (Path(__file__).parent / "golden" / "nextflow_weblog_hello.jsonl").read_text().splitlines()
]
RUN_ID = EVENTS[0]["runId"]


def post(running: Running, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(running.url + "/v1/weblog", data=body, method="POST", headers=headers or {})
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


def send(running: Running, event: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    return post(running, json.dumps(event).encode(), headers)


def replay(running: Running, events: list[dict[str, Any]], headers: dict[str, str] | None = None) -> list[Any]:
    """Post each event, the node busy for a second between events."""
    answers = []
    for event in events:
        answers.append(send(running, event, headers))
        running.step(seconds=1.0, busy_cores=1.0)
    return answers


def test_a_run_opens_one_window_and_completed_closes_it(running: Running) -> None:
    running.agent.step()
    answers = replay(running, EVENTS[:-1])
    assert answers[0][0] == 201 and answers[0][1]["runId"] == RUN_ID
    window = answers[0][1]["window"]
    assert all(status == 200 and doc["window"] == window for status, doc in answers[1:])
    assert len(running.agent.sampler._windows) == 1
    status, result = send(running, EVENTS[-1])
    assert status == 200
    assert result["run"] == {
        "runId": RUN_ID,
        "runName": "friendly_pesquet",
        "outcome": "completed",
        "opened_by": "started",
        "tasks": {"process_submitted": 2, "process_started": 2, "process_completed": 2},
    }
    assert result["label"] == f"nextflow friendly_pesquet {RUN_ID}"
    # 7 steps of 1 s between started and completed: 110 W package + 5 W DRAM each second.
    assert result["seconds"] == pytest.approx(7.0)
    assert result["joules"]["cpu"] == pytest.approx(7 * 110.0) and result["joules"]["dram"] == pytest.approx(7 * 5.0)
    assert result["kilojoules"]["node"] == pytest.approx(7 * 0.115)
    assert running.agent.sampler._windows == {}
    status, kept = running.request("GET", f"/v1/weblog/{RUN_ID}")[:2]
    assert status == 200 and kept == result
    assert send(running, EVENTS[-1]) == (200, {"runId": RUN_ID, "closed": True, "event": "completed"})


def test_error_is_the_outcome_and_the_run_closes_at_completed(running: Running) -> None:
    """errorStrategy 'finish': Nextflow posts error, lets the running tasks end (their
    process_completed) and then posts completed. The run is measured to completed, its outcome
    error (closed at error, the task still running and the minute after were in no run)."""
    running.agent.step()
    t0 = running.clock.now
    assert send(running, event("started", t0))[0] == 201
    for k in (1, 2):
        assert send(running, event("process_submitted", t0, task(k, "ALIGN", t0)))[0] == 200
        assert send(running, event("process_started", t0, task(k, "ALIGN", t0)))[0] == 200
    running.step(seconds=2.0)
    failed = task(1, "ALIGN", t0, t0 + 2, 100.0) | {"status": "FAILED", "exit": 1}
    assert send(running, event("process_completed", t0 + 2, failed))[0] == 200
    assert send(running, error_event(t0 + 2, failed)) == (200, {"runId": RUN_ID, "window": ANY, "event": "error"})
    assert running.request("GET", f"/v1/weblog/{RUN_ID}")[1]["open"] is True
    for _ in range(60):  # task 2 goes on for a minute
        running.step(seconds=1.0)
    done = task(2, "ALIGN", t0, t0 + 62, 100.0) | {"status": "COMPLETED", "exit": 0}
    assert send(running, event("process_completed", t0 + 62, done))[0] == 200
    status, result = send(running, event("completed", t0 + 62))
    assert status == 200 and result["run"]["outcome"] == "error"
    assert result["seconds"] == pytest.approx(62.0)
    assert result["joules"]["node"] == pytest.approx(62 * watts(1.0))
    rows = {row["task_id"]: row for row in result["task_rows"]}
    assert rows["2"]["status"] == "COMPLETED" and rows["2"]["seconds"] == pytest.approx(62.0)
    assert rows["1"]["joules"] + rows["2"]["joules"] == pytest.approx(62 * watts(1.0))
    assert send(running, EVENTS[-1]) == (200, {"runId": RUN_ID, "closed": True, "event": "completed"})
    assert running.agent.sampler._windows == {}


def test_an_error_with_no_completed_after_it_is_closed_at_its_last_event_after_the_idle_bound(
    running: Running,
) -> None:
    from joulesched.measurement.weblog import IDLE_SECONDS

    running.agent.step()
    t0 = running.clock.now
    send(running, event("started", t0))
    running.step(seconds=3.0)
    send(running, error_event(t0 + 3))
    running.clock.tick(IDLE_SECONDS - 1)  # the head job died after error: no completed comes
    assert running.request("GET", f"/v1/weblog/{RUN_ID}")[1]["open"] is True
    running.clock.tick(1)
    status, result = running.request("GET", f"/v1/weblog/{RUN_ID}")[:2]
    assert status == 200 and result["run"]["outcome"] == "error"
    assert result["seconds"] == pytest.approx(3.0), "closed at its last event, not a day of idle later"
    assert any("after error, and no completed" in n for n in result["notes"]), result["notes"]
    assert running.agent.sampler._windows == {}


def test_a_lost_started_event_opens_the_window_at_the_first_task_event(running: Running) -> None:
    running.agent.step()
    status, _ = replay(running, EVENTS[1:2])[0]
    assert status == 201
    status, result = send(running, EVENTS[-1])
    assert status == 200 and result["run"]["opened_by"] == "process_submitted"


def test_a_started_of_an_open_run_is_a_new_run_and_the_dead_one_is_closed_at_its_last_event(
    running: Running,
) -> None:
    """The head job was killed (nothing posted) and the run -resume'd ten minutes later: same
    runId, a new started, task ids from 1 again. The idle minutes and the dead task were the
    resumed run's (it lasted 617 s, its task 1 ran 615 s); now they are in neither run."""
    running.agent.step()
    t0 = running.clock.now
    send(running, event("started", t0))
    send(running, event("process_submitted", t0, task(1, "ALIGN", t0)))
    running.step(seconds=2.0)
    send(running, event("process_started", t0 + 2, task(1, "ALIGN", t0 + 2)))
    running.step(seconds=5.0)  # killed here
    for _ in range(600):  # ten minutes of an idle node before the user resumes
        running.step(seconds=1.0, busy_cores=0.0)
    t1 = running.clock.now
    status, doc = send(running, event("started", t1))
    assert status == 201
    send(running, event("process_started", t1, task(1, "ALIGN", t1)))
    running.step(seconds=10.0)
    send(running, event("process_completed", t1 + 10, task(1, "ALIGN", t1, t1 + 10, 100.0)))
    status, result = send(running, event("completed", t1 + 10))
    assert status == 200 and result["id"] == doc["window"] and result["run"]["outcome"] == "completed"
    assert result["seconds"] == pytest.approx(10.0)
    assert result["joules"]["node"] == pytest.approx(10 * watts(1.0))
    (row,) = result["task_rows"]
    assert row["seconds"] == pytest.approx(10.0) and row["joules"] == pytest.approx(10 * watts(1.0))
    (note,) = result["notes"]
    assert "had no completed before this started: closed as abandoned at its last event" in note
    assert "0.230 kJ over 2 s" in note, "the dead run's window: started to its last event"
    assert running.agent.sampler._windows == {}


def test_resume_reuses_the_run_id_and_opens_a_new_window(running: Running) -> None:
    running.agent.step()
    replay(running, [EVENTS[0]])
    first = send(running, EVENTS[-1])[1]
    status, doc = replay(running, [EVENTS[0]])[0]
    assert status == 201 and doc["window"] != first["id"]
    assert running.request("GET", f"/v1/weblog/{RUN_ID}")[1]["open"] is True


def test_a_sub_second_run_without_a_token_is_closed_unreported(running: Running) -> None:
    running.agent.step()
    assert send(running, EVENTS[0])[0] == 201
    status, doc = send(running, EVENTS[-1])
    assert status == 409 and "at least 1 s" in doc["error"]
    assert running.agent.sampler._windows == {}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({**EVENTS[0], "event": "finished"}, "event must be one of"),
        ({**EVENTS[0], "runId": 7}, "runId must be a string"),
        ({**EVENTS[0], "runId": "x" * 201}, "runId must be a string"),
        ({**EVENTS[0], "runName": ["a"]}, "runName must be a string"),
    ],
)
def test_malformed_events_are_refused(running: Running, body: dict[str, Any], message: str) -> None:
    status, doc = send(running, body)
    assert status == 400 and message in doc["error"]
    assert running.agent.sampler._windows == {}


def test_the_body_cap_and_json_errors_hold(running: Running) -> None:
    import http.client

    host, port = running.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", "/v1/weblog")
    conn.putheader("Content-Length", str(4 * 1024 * 1024 + 1))  # refused before a byte of it is read
    conn.endheaders()
    assert conn.getresponse().status == 413
    conn.close()
    assert post(running, b"{not json")[0] == 400
    assert send(running, {**EVENTS[-1], "runId": "never-started"})[0] == 404


def test_with_a_token_nextflows_basic_token_or_a_bearer_token_is_needed(with_token: Running) -> None:
    with_token.agent.step()
    assert send(with_token, EVENTS[0])[0] == 401
    wrong = base64.b64encode(b"nextflow:wrong").decode()
    assert send(with_token, EVENTS[0], {"Authorization": f"Basic {wrong}"})[0] == 401
    assert send(with_token, EVENTS[0], {"Authorization": "Basic !!!"})[0] == 401
    basic = {"Authorization": "Basic " + base64.b64encode(b"nextflow:s3cret").decode()}  # weblog.basicToken
    assert send(with_token, EVENTS[0], basic)[0] == 201
    with_token.powercap.advance("intel-rapl:0", 2.0)
    with_token.clock.tick(0.05)  # authenticated: sub-second runs are reported
    status, result = send(with_token, EVENTS[-1], {"Authorization": "Bearer s3cret"})
    assert status == 200 and result["joules"]["cpu"] == pytest.approx(2.0)
    assert with_token.request("GET", f"/v1/weblog/{RUN_ID}")[0] == 401
    assert with_token.request("GET", f"/v1/weblog/{RUN_ID}", token="s3cret")[1] == result


# --- per task and per process -------------------------------------------------------------------

TEMPLATE = {e["event"]: e for e in EVENTS}  # one event of each kind, as nf-weblog writes it


def event(kind: str, at: float, task: dict[str, Any] | None = None) -> dict[str, Any]:
    """An event of the recorded run's shape at agent time ``at``; ``task`` overrides trace fields."""
    out = copy.deepcopy(TEMPLATE[kind])
    out["utcTime"] = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if task is not None:
        out["trace"].update(task)
    return out


def error_event(at: float, trace: dict[str, Any] | None = None) -> dict[str, Any]:
    """nf-weblog's error: the failing task's trace, or none."""
    out = event("process_completed", at)
    out["event"] = "error"
    if trace is None:
        del out["trace"]
    else:
        out["trace"] = trace
    return out


def task(
    task_id: int, process: str, start: float, complete: float | None = None, pcpu: float | None = None
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "task_id": task_id,
        "process": process,
        "name": f"{process} ({task_id})",
        "native_id": 30000 + task_id,
        "start": round(start * 1000),
    }
    if complete is not None:
        fields.update(complete=round(complete * 1000), realtime=round((complete - start) * 1000), **{"%cpu": pcpu})
    return fields


# (seconds after the run's start, events at that moment); between them the node is driven by STEPS
def two_process_run(t0: float, skew: float = 0.0) -> list[tuple[float, list[dict[str, Any]]]]:
    s = t0 + skew  # the trace's clock (skew: Nextflow's machine is not this one)
    a1, a2, b1 = task(1, "FASTQC", s + 2), task(2, "FASTQC", s + 2), task(3, "MULTIQC", s + 8)
    return [
        (0, [event("started", t0)]),
        (2, [event("process_submitted", t0 + 2, a1), event("process_submitted", t0 + 2, a2)]),
        (2, [event("process_started", t0 + 2, a1), event("process_started", t0 + 2, a2)]),
        (6, [event("process_completed", t0 + 6, task(1, "FASTQC", s + 2, s + 6, 100.0))]),
        (8, [event("process_completed", t0 + 8, task(2, "FASTQC", s + 2, s + 8, 300.0))]),
        (8, [event("process_submitted", t0 + 8, b1), event("process_started", t0 + 8, b1)]),
        (11, [event("process_completed", t0 + 11, task(3, "MULTIQC", s + 8, s + 11, 50.0))]),
        (12, [event("completed", t0 + 12)]),
    ]


BUSY = [(0, 2, 0.2), (2, 6, 4.0), (6, 8, 3.0), (8, 11, 0.5), (11, 12, 0.1)]  # (from, to, busy cores)


def watts(busy: float) -> float:
    return 100.0 + 10 * busy + 5.0  # Running.step: package 100 W + 10 W per busy core, DRAM 5 W


def drive(running: Running, plan: list[tuple[float, list[dict[str, Any]]]]) -> dict[str, Any]:
    t0 = running.clock.now
    result: dict[str, Any] = {}
    for at, events in plan:
        while running.clock.now < t0 + at - 1e-9:
            busy = next(b for lo, hi, b in BUSY if lo <= running.clock.now - t0 < hi)
            running.step(seconds=1.0, busy_cores=busy)
        for e in events:
            status, doc = send(running, e)
            assert status in (200, 201), doc
            result = doc
    return result


def expected() -> tuple[dict[str, float], float, float]:
    """Each task's joules by the rule (segments split by time × mean cores), outside, total."""
    seg = {(lo, hi): watts(b) * (hi - lo) for lo, hi, b in BUSY}
    a1 = seg[(2, 6)] * 1 / 4
    a2 = seg[(2, 6)] * 3 / 4 + seg[(6, 8)]
    b1 = seg[(8, 11)]
    outside = seg[(0, 2)] + seg[(11, 12)]
    return {"FASTQC (1)": a1, "FASTQC (2)": a2, "MULTIQC (3)": b1}, outside, sum(seg.values())


@pytest.mark.parametrize("skew", [0.0, 86400.0 * 365], ids=["trace times on this clock", "a trace clock a year off"])
def test_tasks_and_processes_add_up_to_the_runs_counter_difference(running: Running, skew: float) -> None:
    running.agent.step()
    before = running.powercap.energy("intel-rapl:0") + running.powercap.energy("intel-rapl:0:1")
    result = drive(running, two_process_run(running.clock.now, skew))
    after = running.powercap.energy("intel-rapl:0") + running.powercap.energy("intel-rapl:0:1")
    tasks, outside, total = expected()
    # the run's energy is the replica's counters' difference over the window, exactly
    assert result["joules"]["node"] == pytest.approx((after - before) / 1e6, abs=1e-9)
    assert result["joules"]["node"] == pytest.approx(total, abs=1e-9)
    got = {row["name"]: row["joules"] for row in result["task_rows"]}
    assert got == pytest.approx(tasks, abs=1e-9)
    assert result["outside_tasks_joules"] == pytest.approx(outside, abs=1e-9)
    assert sum(got.values()) + result["outside_tasks_joules"] == pytest.approx(result["joules"]["node"], abs=1e-9)
    processes = {p["process"]: (p["tasks"], p["joules"]) for p in result["processes"]}
    assert processes == {
        "FASTQC": (2, pytest.approx(tasks["FASTQC (1)"] + tasks["FASTQC (2)"])),
        "MULTIQC": (1, pytest.approx(tasks["MULTIQC (3)"])),
    }
    assert bool(result["notes"]) == bool(skew)


def test_a_task_on_another_host_is_listed_without_energy(running: Running) -> None:
    running.agent.step()
    plan = two_process_run(running.clock.now)
    for _, events in plan:
        for e in events:
            if e.get("trace", {}).get("task_id") == 3:
                e["trace"]["hostname"] = "worker-7"
    result = drive(running, plan)
    rows = {row["name"]: row for row in result["task_rows"]}
    assert rows["MULTIQC (3)"]["here"] is False and rows["MULTIQC (3)"]["joules"] is None
    _, _, total = expected()
    measured = sum(r["joules"] for r in rows.values() if r["joules"] is not None)
    assert measured + result["outside_tasks_joules"] == pytest.approx(total, abs=1e-9)
    assert any("another host" in n for n in result["notes"])


def test_the_html_report_is_self_contained_and_shows_every_task(running: Running, tmp_path: Path) -> None:
    from joulesched.measurement import weblog_report

    running.agent.step()
    plan = two_process_run(running.clock.now)
    plan[1][1][0]["trace"]["name"] = "FASTQC (<script>alert(1)</script>)"  # run text is escaped
    drive(running, plan)
    out = tmp_path / "run.html"
    code = weblog_report.main(["--agent", running.url, "--run", RUN_ID, "--intensity", "300", "-o", str(out)])
    assert code == 0
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 2
    assert "<script" not in page and "&lt;script&gt;" in page
    # nothing is fetched from elsewhere: no URL in any attribute
    assert re.findall(r"(?:src|href)\s*=", page) == [] and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )
    for name in ("MULTIQC (3)", "FASTQC (2)", "FASTQC", "MULTIQC", "gCO2e"):
        assert name in page
    tasks, _, total = expected()
    assert f"{total:,.1f} J" in page and f"{tasks['MULTIQC (3)']:,.1f}" in page


def test_the_html_report_of_an_open_run_says_to_wait(
    running: Running, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from joulesched.measurement import weblog_report

    running.agent.step()
    send(running, EVENTS[0])
    assert weblog_report.main(["--agent", running.url, "--run", RUN_ID, "-o", str(tmp_path / "x.html")]) == 1
    assert "still running" in capsys.readouterr().err


def test_a_task_pod_on_this_node_carries_the_agents_per_pod_energy(running: Running) -> None:
    """Kubernetes executor: native_id is the task's pod; here the replica's pod (named by its UID
    while the API is off), whose hostname is the pod's, not the node's."""
    from tests.measurement.agent_server_support import POD

    running.agent.step()
    plan = two_process_run(running.clock.now)
    for _, events in plan:
        for e in events:
            if e.get("trace", {}).get("task_id") == 3:
                e["trace"].update(native_id=POD, hostname="nf-3f2a9c-task")
    result = drive(running, plan)
    rows = {row["name"]: row for row in result["task_rows"]}
    snapshot = running.agent.sampler.latest
    assert snapshot is not None
    (pod,) = [p for p in snapshot.pods if p.uid == POD]
    assert rows["MULTIQC (3)"]["here"] is True and rows["MULTIQC (3)"]["pod"] == POD
    assert rows["MULTIQC (3)"]["pod_joules"] == pytest.approx(sum(pod.energy_joules_total.values()))
    assert rows["MULTIQC (3)"]["pod_joules"] > 0
    assert rows["FASTQC (1)"]["pod_joules"] is None  # its native_id names no pod on this node


class SteppedClock(SteadyClock):
    """The agent's clock on two fake system clocks: ``tick`` moves both, ``set_ahead`` the wall
    clock only; ``now`` is the system clock's time of day, as Nextflow on this host stamps it."""

    def __init__(self) -> None:
        self.system, self.boot = Clock(1_764_400_000.0), Clock(5_000.0)
        super().__init__(self.system, self.boot)

    @property
    def now(self) -> float:
        return self.system.now

    def tick(self, seconds: float = 1.0) -> float:
        self.boot.tick(seconds)
        return self.system.tick(seconds)

    def set_ahead(self, seconds: float) -> None:
        self.system.tick(seconds)


def test_trace_times_after_a_step_of_the_system_clock_fall_on_the_same_reads(tmp_path: Path) -> None:
    """The trace's start and complete are the system clock's; after it was set 3 s ahead they are
    taken back by the step the agent has seen, and each task keeps its own energy (without that,
    every task would be read 3 s late, inside the window, with no note)."""
    clock = SteppedClock()
    running = start(tmp_path, clock)  # type: ignore[arg-type]  # it ticks as FakeClock does
    try:
        running.agent.step()
        clock.set_ahead(3.0)
        result = drive(running, two_process_run(clock.now))
    finally:
        running.server.shutdown()
        running.server.server_close()
        running.agent.stop()
    tasks, outside, total = expected()
    assert result["joules"]["node"] == pytest.approx(total, abs=1e-9)
    assert {row["name"]: row["joules"] for row in result["task_rows"]} == pytest.approx(tasks, abs=1e-9)
    assert result["outside_tasks_joules"] == pytest.approx(outside, abs=1e-9)
    assert not result["notes"]
    assert result["start"] == pytest.approx(clock.now - 12.0), "the window's times are the system clock's"


def test_a_completed_event_carrying_a_large_workflow_closes_its_run(running: Running) -> None:
    """nf-weblog sends the run's parameters and workflow with completed as with started: an
    nf-core pipeline's are tens of KiB, and a completed refused for its size left the run open."""
    running.agent.step()
    params = {f"param_{i}": "x" * 100 for i in range(1000)}  # ~100 KiB of parameters
    started = copy.deepcopy(EVENTS[0])
    started["metadata"]["parameters"] = params
    assert send(running, started)[0] == 201
    running.step(seconds=2.0)
    completed = copy.deepcopy(EVENTS[-1])
    completed["metadata"]["parameters"] = params
    status, doc = send(running, completed)
    assert status == 200 and doc["run"]["outcome"] == "completed"
    assert running.agent.sampler._windows == {}


def test_without_a_token_no_task_is_split_from_reads_closer_than_a_second(running: Running) -> None:
    """The side-channel rule: an unauthenticated run gives no energy over less than a second, per
    task neither (a task started and completed 1 ms apart gave the counters' difference)."""
    running.agent.step()
    t0 = running.clock.now
    assert send(running, event("started", t0))[0] == 201
    running.step(seconds=1.0)
    at = running.clock.now
    assert send(running, event("process_started", at, task(1, "PROBE", at)))[0] == 200
    running.step(seconds=0.001)
    assert send(running, event("process_completed", at, task(1, "PROBE", at, at + 0.001, 100.0)))[0] == 200
    running.step(seconds=1.0)
    status, doc = send(running, event("completed", running.clock.now))
    assert status == 200
    assert doc["segments"] == 2, "the reads 1 ms apart are one segment of a second, not two"
    (row,) = doc["task_rows"]
    assert row["joules"] == pytest.approx(doc["joules"]["node"] - doc["outside_tasks_joules"])
    assert row["joules"] > 100.0, "the second it ran in, not the millisecond's 0.1 J"


def test_a_task_only_submitted_never_ran_and_gets_no_time_or_energy(running: Running) -> None:
    """Queued (executor full, a batch queue) when the run failed: it took half the run's energy as
    if it had run from the run's start to its end."""
    running.agent.step()
    t0 = running.clock.now
    send(running, event("started", t0))
    send(running, event("process_submitted", t0, task(1, "ALIGN", t0)))
    send(running, event("process_started", t0, task(1, "ALIGN", t0)))
    running.step(seconds=8.0)
    queued = task(2, "ALIGN", t0 + 8)
    del queued["start"]  # a submitted task's trace has no start
    send(running, event("process_submitted", t0 + 8, queued))
    running.step(seconds=2.0)
    send(running, event("process_completed", t0 + 10, task(1, "ALIGN", t0, t0 + 10, 100.0)))
    send(running, error_event(t0 + 10))
    status, result = send(running, event("completed", t0 + 10))
    assert status == 200
    rows = {row["task_id"]: row for row in result["task_rows"]}
    assert rows["2"]["seconds"] == 0.0 and rows["2"]["joules"] == 0.0
    assert rows["2"]["start"] == rows["2"]["end"] == pytest.approx(result["start"] + 8.0), "placed at its submission"
    assert rows["1"]["joules"] == pytest.approx(10 * watts(1.0)) == pytest.approx(result["joules"]["node"])
    assert any("1 task(s) were submitted but never started" in n for n in result["notes"]), result["notes"]


def test_task_rows_are_in_wall_time_as_the_run_is_after_a_step_of_the_system_clock(tmp_path: Path) -> None:
    """The run's start and end are wall time (agent stamps + the step); its task rows were left
    on the agent's stamps, an hour before the run, and the report's bars drawn off its canvas."""
    from joulesched.measurement.weblog_report import render_html

    clock = SteppedClock()
    running = start(tmp_path, clock)  # type: ignore[arg-type]  # it ticks as FakeClock does
    try:
        running.agent.step()
        clock.set_ahead(3600.0)
        result = drive(running, two_process_run(clock.now))
    finally:
        running.server.shutdown()
        running.server.server_close()
        running.agent.stop()
    assert result["start"] == pytest.approx(clock.now - 12.0)
    at = {row["name"]: (row["start"] - result["start"], row["end"] - result["start"]) for row in result["task_rows"]}
    assert at == {
        "FASTQC (1)": (pytest.approx(2.0), pytest.approx(6.0)),
        "FASTQC (2)": (pytest.approx(2.0), pytest.approx(8.0)),
        "MULTIQC (3)": (pytest.approx(8.0), pytest.approx(11.0)),
    }
    page = render_html(result)
    xs = [float(x) for x in re.findall(r'<rect x="([-0-9.]+)" y="\d+" width="[0-9.]+" height="11"', page)]
    assert len(xs) == 3 and all(10.0 <= x <= 710.0 for x in xs), xs


def test_a_source_that_opens_during_a_run_is_in_neither_its_energy_nor_its_tasks(tmp_path: Path) -> None:
    """A BMC (whole-server reading) opens mid-run: the run's energy is on RAPL (the zones read at
    both its edges), and so is every segment, so tasks + outside equal it (the segments after the
    BMC opened were on the BMC's basis: 2 700 J of tasks for a 1 100 J run)."""
    from joulesched.measurement.config import AgentConfig, SourcesConfig
    from joulesched.measurement.errors import SourceFailed
    from joulesched.measurement.meter import Pending
    from joulesched.measurement.sampler import Sampler
    from joulesched.measurement.sources.base import Roots
    from joulesched.measurement.sources.registry import open_sources
    from joulesched.measurement.weblog import WeblogRuns
    from tests.measurement.fakes import FakeClock, FakeSource, FakeZone
    from tests.measurement.replica import PowercapTree

    roots = Roots(
        sysfs=str(tmp_path / "sys"),
        procfs=str(tmp_path / "proc"),
        cgroup=str(tmp_path / "cg"),
        dev=str(tmp_path / "dev"),
    )
    powercap = PowercapTree(Path(roots.sysfs))
    powercap.add("intel-rapl:0", "package-0", energy_uj=5_000_000_000)
    clock = FakeClock()
    up = [False]

    def bmc() -> FakeSource:
        if not up[0]:
            raise SourceFailed("ipmi_dcmi: session timeout")
        return FakeSource("ipmi_dcmi", [FakeZone("chassis", "platform", "power", clock, 300.0)])

    config = AgentConfig(roots=roots, sources=SourcesConfig(order=("rapl_sysfs", "ipmi_dcmi")))
    sampler = Sampler(
        config,
        open_sources(("rapl_sysfs",), {}, roots, clock).sources,
        node="n1",
        clock=clock,
        pending=[Pending("ipmi_dcmi", bmc, "ipmi_dcmi: session timeout")],
    )
    sampler.sample()
    runs = WeblogRuns(sampler, clock, 1.0)
    t0 = clock()
    assert runs.handle(event("started", t0), True)[0] == 201
    runs.handle(event("process_started", t0, task(1, "ALIGN", t0)), True)
    for i in range(10):
        up[0] = up[0] or i == 2  # the BMC opens during the task
        clock.tick()
        powercap.advance("intel-rapl:0", 110.0)
        sampler.sample()
        runs.handle(event("process_submitted", clock(), task(100 + i, "PROBE", clock())), True)  # reads
    assert sampler.meter.layout.platform == "ipmi_dcmi"
    runs.handle(event("process_completed", clock(), task(1, "ALIGN", t0, clock(), 100.0)), True)
    status, result = runs.handle(event("completed", clock()), True)
    assert status == 200 and result["sources"] == ["rapl_sysfs"]
    assert result["joules"]["node"] == pytest.approx(10 * 110.0)
    tasks = sum(row["joules"] for row in result["task_rows"])
    assert tasks == pytest.approx(10 * 110.0)
    assert tasks + result["outside_tasks_joules"] == pytest.approx(result["joules"]["node"], abs=1e-9)
    assert any("read at only one edge" in n and "ipmi_dcmi/chassis" in n for n in result["notes"]), result["notes"]


def test_runs_with_no_event_for_the_idle_bound_give_back_their_windows(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Head jobs killed without error or completed: their runs held windows for good, and once
    the open-window limit was reached every new run and POST /v1/windows got 429."""
    from joulesched.measurement import sampler as sampler_module
    from joulesched.measurement.weblog import IDLE_SECONDS

    monkeypatch.setattr(sampler_module, "MAX_WINDOWS", 3)
    running.agent.step()
    dead = [f"dead-{i}" for i in range(3)]
    for run_id in dead:
        assert send(running, {**event("started", running.clock.now), "runId": run_id})[0] == 201
        running.step(seconds=1.0)
        assert send(running, {**event("process_submitted", running.clock.now, task(1, "A", 0)), "runId": run_id})[0]
    assert send(running, {**event("started", running.clock.now), "runId": "new"})[0] == 429
    assert running.request("POST", "/v1/windows", {"label": "x"})[0] == 429
    running.clock.tick(IDLE_SECONDS - 2.0)  # dead-0's last event is IDLE_SECONDS old, dead-1's and dead-2's younger
    running.agent.step()
    status, doc = running.request("POST", "/v1/windows", {"label": "x"})[:2]
    assert status == 201, doc
    assert [running.request("GET", f"/v1/weblog/{r}")[1].get("open") for r in dead] == [None, True, True]
    running.clock.tick(2.0)
    assert send(running, {**event("started", running.clock.now), "runId": "new"})[0] == 201
    status, result = running.request("GET", "/v1/weblog/dead-2")[:2]
    assert status == 200 and result["run"]["outcome"] == "abandoned"
    assert result["seconds"] == pytest.approx(1.0), "closed at its last event"
    assert any("no error or completed: closed as abandoned at its last event" in n for n in result["notes"])
    late = {**event("process_completed", running.clock.now, task(1, "A", 0, 1, 100.0)), "runId": "dead-2"}
    assert send(running, late) == (200, {"runId": "dead-2", "closed": True, "event": "process_completed"})


def test_tasks_past_the_limit_are_counted_in_a_note(running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    from joulesched.measurement import weblog

    monkeypatch.setattr(weblog, "MAX_TASKS", 2)
    running.agent.step()
    t0 = running.clock.now
    send(running, event("started", t0))
    for k in (1, 2, 3):
        send(running, event("process_submitted", t0, task(k, "A", t0)))
        send(running, event("process_started", t0, task(k, "A", t0)))
    running.step(seconds=5.0)
    for k in (1, 2, 3):
        send(running, event("process_completed", t0 + 5, task(k, "A", t0, t0 + 5, 100.0)))
    status, result = send(running, event("completed", t0 + 5))
    assert status == 200 and result["run"]["tasks"]["process_completed"] == 3
    assert [row["task_id"] for row in result["task_rows"]] == ["1", "2"]
    assert any("1 task(s) past the first 2 of the run were not tracked" in n for n in result["notes"]), result["notes"]
