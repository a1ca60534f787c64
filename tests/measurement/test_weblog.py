"""``POST /v1/weblog``: Nextflow's ``-with-weblog`` events open and close one window per run.

``golden/nextflow_weblog_hello.jsonl`` is an event sequence of ``nextflow run hello`` (two tasks)
built field for field as nf-weblog's ``WebLogObserver.sendHttpMessage`` writes it (``runName``,
``runId``, ``event``, ``utcTime``, and ``metadata`` {parameters, workflow} or ``trace``: the
task's trace record); it is not captured from a live run.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.measurement.agent_server_support import Running

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


def test_error_closes_the_run_and_the_completed_after_it_is_answered(running: Running) -> None:
    running.agent.step()
    replay(running, EVENTS[:3])
    error = {**EVENTS[1], "event": "error", "trace": {**EVENTS[1]["trace"], "status": "FAILED", "exit": 1}}
    status, result = send(running, error)
    assert status == 200 and result["run"]["outcome"] == "error" and result["seconds"] == pytest.approx(3.0)
    assert send(running, EVENTS[-1])[1]["closed"] is True
    assert running.agent.sampler._windows == {}


def test_a_lost_started_event_opens_the_window_at_the_first_task_event(running: Running) -> None:
    running.agent.step()
    status, _ = replay(running, EVENTS[1:2])[0]
    assert status == 201
    status, result = send(running, EVENTS[-1])
    assert status == 200 and result["run"]["opened_by"] == "process_submitted"


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
    assert post(running, b"x" * (64 * 1024 + 1))[0] == 413
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
