"""The deferrer's mutating admission webhook: adds the ``joulesched.io/deferred`` gate at creation.

A scheduling gate can only be set when a pod is created, so a pod that opts in by annotation
(``joulesched.io/deadline`` or ``joulesched.io/max-delay-seconds``) needs the gate added then:
by its author in ``spec.schedulingGates``, or by this webhook. The MutatingWebhookConfiguration
(deploy/deferrer/webhook.yaml) sends only pods labelled ``joulesched.io/deferrable: "true"``
(objectSelector), on CREATE, with ``failurePolicy: Ignore``: a webhook that is down never blocks
pod creation, the pod is then simply not deferred.

Wire format: ``admission.k8s.io/v1`` AdmissionReview (k8s.io/api/admission/v1/types.go). The
answer echoes ``request.uid``, allows every pod, and for an opting-in pod carries a base64
RFC 6902 JSON patch with ``patchType: JSONPatch``. A pod whose annotations are malformed is
allowed unchanged with a warning naming the annotation (kubectl prints it), never gated: a gate
it could not be released from by its own terms would only be removed again by the deferrer.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from joulesched.extender.errors import ExtenderError
from joulesched.extender.logsafe import escape
from joulesched.policy.deferral import DEADLINE_ANNOTATION, GATE, MAX_DELAY_ANNOTATION, deferral_from_pod
from joulesched.policy.errors import PolicyError

log = logging.getLogger(__name__)

REVIEW_API_VERSION = "admission.k8s.io/v1"
PATH = "/mutate"
OPT_IN_LABEL = "joulesched.io/deferrable"  # the webhook's objectSelector: only these pods are sent
MAX_BODY = 4 << 20  # a pod is at most ~1.5 MiB in etcd; an AdmissionReview carries it (and oldObject) once


class ReviewError(ExtenderError, ValueError):
    """An AdmissionReview request that is not one; the message names the field."""


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}


def _field(parent: Mapping[str, Any], key: str, path: str, kind: type) -> Any:
    """``parent[key]``: absent or null (None), else of type ``kind``; :class:`ReviewError`
    naming ``path`` otherwise."""
    value = parent.get(key)
    if value is not None and not isinstance(value, kind):
        raise _wrong_type(path, kind, value)
    return value


def _wrong_type(path: str, kind: type, value: Any) -> ReviewError:
    got = _JSON_TYPES.get(type(value), type(value).__name__)
    return ReviewError(f"AdmissionReview: {path} must be {_JSON_TYPES[kind]}, got {got}")


def check_pod(pod: Mapping[str, Any], path: str = "request.object") -> None:
    """:class:`ReviewError` naming the first field of ``pod`` the webhook reads that has the
    wrong JSON type (the API server sends a Pod it has decoded: these come from no API server)."""
    meta = _field(pod, "metadata", f"{path}.metadata", dict)
    if meta:
        _field(meta, "annotations", f"{path}.metadata.annotations", dict)
        for key in ("name", "generateName", "namespace"):
            _field(meta, key, f"{path}.metadata.{key}", str)
    spec = _field(pod, "spec", f"{path}.spec", dict)
    if spec:
        gates = _field(spec, "schedulingGates", f"{path}.spec.schedulingGates", list)
        for i, gate in enumerate(gates or ()):
            if not isinstance(gate, dict):
                raise _wrong_type(f"{path}.spec.schedulingGates[{i}]", dict, gate)
        _field(spec, "nodeName", f"{path}.spec.nodeName", str)


def opts_in(pod: Mapping[str, Any]) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return isinstance(annotations, Mapping) and (
        DEADLINE_ANNOTATION in annotations or MAX_DELAY_ANNOTATION in annotations
    )


def gate_patch(pod: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON patch that adds the gate to ``pod`` (empty when none is due), and warnings."""
    if not opts_in(pod):
        return [], []
    spec = pod.get("spec") or {}
    gates = spec.get("schedulingGates") or []
    if any(isinstance(g, Mapping) and g.get("name") == GATE for g in gates):
        return [], []
    if spec.get("nodeName"):
        return [], [f"{GATE}: not added, the pod names its node (spec.nodeName) and bypasses scheduling"]
    try:
        # the creation time is not set yet at admission; the terms' validity does not depend on it
        deferral_from_pod(pod, created=time.time())
    except PolicyError as err:
        return [], [f"{err}; the pod is not deferred"]
    if gates:
        return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}}], []
    return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}], []


def review(body: bytes, namespace: str = "") -> dict[str, Any]:
    """The AdmissionReview answer to one request body; :class:`ReviewError` for a malformed one.
    ``namespace``: the one namespace the deferrer watches (``--namespace``; "" for all): a pod of
    another is left ungated, since nothing would release it."""
    try:
        doc = json.loads(body)
    except ValueError as err:
        raise ReviewError(f"AdmissionReview: not JSON: {err}") from err
    except RecursionError:
        raise ReviewError("AdmissionReview: JSON nested deeper than the webhook reads (no AdmissionReview is)") from None
    if not isinstance(doc, dict):
        raise ReviewError("AdmissionReview: must be a JSON object")
    if doc.get("apiVersion") != REVIEW_API_VERSION or doc.get("kind") != "AdmissionReview":
        raise ReviewError(
            f"AdmissionReview: apiVersion/kind must be {REVIEW_API_VERSION}/AdmissionReview, "
            f"got {str(doc.get('apiVersion'))[:40]!r}/{str(doc.get('kind'))[:40]!r} "
            "(set admissionReviewVersions: [v1] in the webhook configuration)"
        )
    request = doc.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise ReviewError("AdmissionReview: request.uid must be a non-empty string")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    kind = _field(_field(request, "kind", "request.kind", dict) or {}, "kind", "request.kind.kind", str)
    operation = _field(request, "operation", "request.operation", str)
    _field(request, "namespace", "request.namespace", str)
    pod = _field(request, "object", "request.object", dict) if operation == "CREATE" and kind == "Pod" else None
    if pod is not None:
        check_pod(pod)
        patch, warnings = gate_patch(pod)
        where = request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or ""
        if patch and namespace and where != namespace:
            patch, warnings = [], [f"{GATE}: not added, the deferrer releases pods of namespace {namespace} only"]
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        if warnings:
            response["warnings"] = warnings
        meta = pod.get("metadata") or {}
        log.info(
            "admission %s %s/%s: %s",
            escape(request["uid"]),
            escape(request.get("namespace") or ""),
            escape(meta.get("name") or meta.get("generateName") or ""),
            "gated" if patch else "unchanged",
        )
    return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}


class _Handler(BaseHTTPRequestHandler):
    """Every request gets a JSON answer: 400 naming what is wrong with it, 500 (logged with its
    trace) for a failure of the webhook's own, never a connection closed without one."""

    server_version = "joulesched-deferrer"
    _answered = False

    def do_POST(self) -> None:
        try:
            self._post()
        except Exception as err:
            if self._answered:  # the answer itself failed (the client went away): nothing to say it on
                raise
            log.exception("webhook: POST %s failed", escape(self.path))
            self._send(500, {"error": f"the webhook failed: {type(err).__name__}: {err}"[:500]})

    def _post(self) -> None:
        if self.path.split("?", 1)[0] != PATH:
            self._send(404, {"error": f"no such path; the webhook is POST {PATH}"})
            return
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY:
            self._send(400, {"error": f"Content-Length must be 1..{MAX_BODY}"})
            return
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            self._send(408, {"error": f"the request body of {length} bytes did not arrive in time"})
            return
        if len(body) < length:
            self._send(400, {"error": f"the request body ended after {len(body)} of its Content-Length {length} bytes"})
            return
        try:
            answer = review(body, getattr(self.server, "namespace", ""))
        except ReviewError as err:
            self._send(400, {"error": str(err)})
            return
        self._send(200, answer)

    def _send(self, code: int, doc: Mapping[str, Any]) -> None:
        self._answered = True
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("webhook %s " + format, self.client_address[0], *args)


class _TLSServer(ThreadingHTTPServer):
    """TLS handshakes in each request's thread: a client that stalls mid-handshake holds its
    thread only, never the accept loop (as wrapping the listening socket would)."""

    daemon_threads = True
    handshake_timeout = 10.0

    def __init__(self, address: tuple[str, int], ctx: ssl.SSLContext, namespace: str = "") -> None:
        super().__init__(address, _Handler)
        self.ctx = ctx
        self.namespace = namespace

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(self.handshake_timeout)
        tls = self.ctx.wrap_socket(request, server_side=True)  # takes the socket's descriptor over
        try:
            _Handler(tls, client_address, self)
        finally:
            tls.close()  # shutdown_request closes the detached socket only: this one held the descriptor

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("webhook: connection from %s failed", client_address, exc_info=True)


class WebhookServer:
    """``POST /mutate`` over TLS on ``host:port`` in a daemon thread; ``namespace``: the one the
    deferrer watches ("" for all)."""

    def __init__(self, host: str, port: int, cert_file: str, key_file: str, namespace: str = "") -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self.ctx, self.cert_file, self.key_file = ctx, cert_file, key_file
        self._stamp = self._files_stamp()
        try:
            ctx.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as err:
            raise ExtenderError(
                f"webhook TLS: cannot load --tls-cert {cert_file} / --tls-key {key_file}: {err}"
            ) from err
        self.httpd = _TLSServer((host, port), ctx, namespace)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="webhook", daemon=True)

    def _files_stamp(self) -> tuple[tuple[int, int], ...] | None:
        try:
            return tuple((st.st_mtime_ns, st.st_size) for st in map(os.stat, (self.cert_file, self.key_file)))
        except OSError:
            return None

    def reload_if_changed(self) -> bool:
        """Load the certificate again when its files have changed (cert-manager renewing it):
        handshakes from then on use it. A pair that cannot be loaded (written half-way) keeps the
        one in use, and is tried again at the next call. True when it was loaded."""
        stamp = self._files_stamp()
        if stamp is None or stamp == self._stamp:
            return False
        try:
            self.ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as err:
            log.warning("webhook TLS: keeping the certificate in use: cannot load the new one: %s", err)
            return False
        self._stamp = stamp
        log.info("webhook TLS: certificate %s loaded again", self.cert_file)
        return True

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
