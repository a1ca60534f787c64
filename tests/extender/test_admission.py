"""extender/admission.py: a malformed AdmissionReview is answered 400 naming the field, any other
failure of the webhook a JSON 500 (logged), never a connection closed without an answer.

The API server sends a Pod it has decoded, so none of these comes from one: they come from
whatever else reaches the webhook's port. Before, a field of the wrong type (``request.kind`` a
string, ``metadata`` or ``spec`` not objects) raised AttributeError and JSON nested 100,000 deep
RecursionError, and the connection was closed without a reply.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import re
import shutil
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from joulesched.extender import admission
from joulesched.extender.admission import ReviewError, WebhookServer, review
from joulesched.policy.deferral import GATE, MAX_DELAY_ANNOTATION

UID = "705ab4f5-6393-11e8-b7cc-42010a800002"
OPTS_IN = {"annotations": {MAX_DELAY_ANNOTATION: "600"}, "name": "p", "namespace": "ns"}


def body(request: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": UID, **request}}).encode()


def pod_review(**pod: Any) -> bytes:
    return body({"operation": "CREATE", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "ns", "object": pod})


DEEP = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":' + b"[" * 100_000 + b"]" * 100_000 + b"}"

MALFORMED = [
    (body({"operation": "CREATE", "kind": "Pod", "object": {"metadata": OPTS_IN}}), "request.kind must be an object, got a string"),
    (body({"operation": "CREATE", "kind": {"kind": 7}, "object": {}}), "request.kind.kind must be a string, got a number"),
    (body({"operation": ["CREATE"], "kind": {"kind": "Pod"}}), "request.operation must be a string, got an array"),
    (body({"operation": "CREATE", "namespace": 1, "kind": {"kind": "Pod"}}), "request.namespace must be a string, got a number"),
    (body({"operation": "CREATE", "kind": {"kind": "Pod"}, "object": ["x"]}), "request.object must be an object, got an array"),
    (pod_review(metadata=["x"]), "request.object.metadata must be an object, got an array"),
    (pod_review(metadata=[]), "request.object.metadata must be an object, got an array"),
    (pod_review(metadata={"annotations": ["x"]}), "request.object.metadata.annotations must be an object, got an array"),
    (pod_review(metadata={**OPTS_IN, "name": 5}), "request.object.metadata.name must be a string, got a number"),
    (pod_review(metadata={**OPTS_IN, "generateName": {}}), "request.object.metadata.generateName must be a string, got an object"),
    (pod_review(metadata=OPTS_IN, spec=["x"]), "request.object.spec must be an object, got an array"),
    (pod_review(metadata=OPTS_IN, spec="x"), "request.object.spec must be an object, got a string"),
    (pod_review(metadata=OPTS_IN, spec={"schedulingGates": "x"}), "request.object.spec.schedulingGates must be an array, got a string"),
    (
        pod_review(metadata=OPTS_IN, spec={"schedulingGates": [{"name": "a"}, "b"]}),
        r"request.object.spec.schedulingGates\[1\] must be an object, got a string",
    ),
    (pod_review(metadata=OPTS_IN, spec={"nodeName": True}), "request.object.spec.nodeName must be a string, got a boolean"),
    (DEEP, "JSON nested deeper than the webhook reads"),
]
CASES = [says.split(" must")[0].replace("\\", "") for _, says in MALFORMED]


@pytest.mark.parametrize(("request_body", "says"), MALFORMED, ids=CASES)
def test_a_field_of_the_wrong_type_is_a_review_error_naming_it(request_body: bytes, says: str) -> None:
    with pytest.raises(ReviewError, match=f"^AdmissionReview: {says}"):
        review(request_body)


def test_null_fields_and_fields_the_webhook_does_not_read_are_not_errors() -> None:
    answer = review(pod_review(metadata={**OPTS_IN, "labels": None}, spec={"schedulingGates": None, "nodeName": None}))
    assert answer["response"]["patchType"] == "JSONPatch"
    # an UPDATE, or another kind, is allowed unread
    assert review(body({"operation": "UPDATE", "kind": {"kind": "Pod"}, "object": ["x"]}))["response"] == {"uid": UID, "allowed": True}
    assert review(body({"operation": "CREATE", "kind": {"kind": "Secret"}, "object": "x"}))["response"] == {"uid": UID, "allowed": True}
    assert review(body({"operation": "CREATE", "kind": None, "object": "x"}))["response"] == {"uid": UID, "allowed": True}


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WebhookServer, ssl.SSLContext]]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI")
    from tests.extender.test_tls import ca, sign

    d = tmp_path_factory.mktemp("webhook")
    root = ca(d, "root")
    crt, key = sign(d, "webhook", root, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    server = WebhookServer("127.0.0.1", 0, str(crt), str(key))
    server.start()
    yield server, ssl.create_default_context(cafile=str(root[0]))
    server.stop()


def post(webhook: tuple[WebhookServer, ssl.SSLContext], data: bytes) -> tuple[int, dict[str, Any]]:
    server, ctx = webhook
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=ctx, timeout=10)
    try:
        conn.request("POST", "/mutate?timeout=10s", body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.getheader("Content-Type") == "application/json"
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.parametrize(("request_body", "says"), MALFORMED, ids=CASES)
def test_the_webhook_answers_a_malformed_review_400_naming_the_field(
    webhook: tuple[WebhookServer, ssl.SSLContext], request_body: bytes, says: str
) -> None:
    status, answer = post(webhook, request_body)
    assert status == 400
    assert set(answer) == {"error"}
    assert re.match(f"^AdmissionReview: {says}", answer["error"]), answer


def test_the_webhook_answers_its_own_failure_500_with_json_and_logs_it(
    webhook: tuple[WebhookServer, ssl.SSLContext], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(body: bytes, namespace: str = "") -> dict[str, Any]:
        raise KeyError("spec")

    monkeypatch.setattr(admission, "review", broken)
    with caplog.at_level(logging.ERROR, logger="joulesched.extender.admission"):
        status, answer = post(webhook, pod_review(metadata=OPTS_IN))
    assert status == 500 and answer == {"error": "the webhook failed: KeyError: 'spec'"}
    record = next(r for r in caplog.records if r.getMessage() == "webhook: POST /mutate?timeout=10s failed")
    assert record.exc_info is not None and record.exc_info[0] is KeyError  # with its trace
    monkeypatch.undo()
    status, answer = post(webhook, pod_review(metadata=OPTS_IN))  # the server serves on
    assert status == 200 and answer["response"]["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(answer["response"]["patch"])) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}
    ]


def raw_exchange(port: int, ctx: ssl.SSLContext | None, head: bytes, sent: bytes, then_close: bool) -> bytes:
    """Send ``head`` and ``sent`` of the body, then shut the writing side (``then_close``; plain
    TCP only: TLS has no half-close) or stall; what the server answers, read to its end."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1") if ctx is not None else raw
    with sock:
        sock.sendall(head + sent)
        if then_close:
            sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        return reply


HEAD = b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"


def test_a_body_shorter_than_its_content_length_is_answered_400() -> None:
    from http.server import ThreadingHTTPServer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), admission._Handler)  # the webhook's handler, without TLS
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        reply = raw_exchange(httpd.server_address[1], None, HEAD, b'{"apiVersion"', then_close=True)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert reply.startswith(b"HTTP/1.0 400 ")
    assert json.loads(reply.partition(b"\r\n\r\n")[2]) == {"error": "the request body ended after 13 of its Content-Length 100 bytes"}


def test_a_body_that_stalls_is_answered_408(webhook: tuple[WebhookServer, ssl.SSLContext], monkeypatch: pytest.MonkeyPatch) -> None:
    server, ctx = webhook
    monkeypatch.setattr(server.httpd, "handshake_timeout", 0.5)  # the socket's timeout, reads included
    started = time.monotonic()
    reply = raw_exchange(server.port, ctx, HEAD, b'{"apiVersion"', then_close=False)
    assert reply.startswith(b"HTTP/1.0 408 ") and time.monotonic() - started < 5
    assert json.loads(reply.partition(b"\r\n\r\n")[2]) == {"error": "the request body of 100 bytes did not arrive in time"}
