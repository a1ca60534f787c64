"""Register the physical server with a NADIKI registrar and keep its id on disk.

The registrar's API (``server-api.spec.yaml``): ``POST /servers`` with a ``ServerCreate`` body
answers ``201`` with a ``ServerResponse`` (the server's ``id`` and its ``timeSeriesConfig``);
``GET /servers/{id}`` answers the same object; ``PUT /servers/{id}`` replaces the description.

:func:`ensure_registration` registers once and reuses the id ever after. The state file holds
the registrar's URL, the id, the body that was registered and the last answer (whose
``timeSeriesConfig`` carries the InfluxDB token: the file is written with mode 0600, atomically).
On every start:

* same registrar, same facility and rack → ``GET /servers/{id}`` for the current time-series
  config (tokens rotate), or ``PUT`` when the description changed (a GPU added, memory grown);
  ``404`` → the registrar forgot the server: register again; registrar unreachable → keep pushing
  with the stored config and say so;
* another registrar, or the server moved to another facility or rack (the id embeds both) →
  register anew; the log names the old id.

The spec defines no authentication for the registrar; a bearer token (``registrar_token_file``)
is sent when configured, never to another origin a redirect names (``contracts.net.open_url``).
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from joulesched.contracts.net import open_url
from joulesched.measurement.nadiki.errors import RegistrationFailed
from joulesched.measurement.nadiki.model import Registration, ServerDescription, parse_registration

log = logging.getLogger(__name__)


@dataclass
class RegistrarClient:
    """JSON over HTTP(S) to one registrar (``url`` is the API base, e.g. ``https://registry.example/v1``)."""

    url: str
    token: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    timeout_s: float = 10.0

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None) -> tuple[int, Any]:
        url = self.url.rstrip("/") + path
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        context = ssl.create_default_context(cafile=self.ca_file) if url.startswith("https") else None
        where = f"NADIKI registrar {self.url}: {method} {path}"
        try:
            with open_url(request, timeout=self.timeout_s, context=context) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as err:
            raw = err.read()
            detail = _error_detail(raw) or err.reason
            fixes = {
                400: "the registrar rejected the server description: fix nadiki.server in the config",
                401: "set nadiki.registrar_token_file to a valid token",
                403: "the token lacks the right to register servers",
                404: "unknown server id",
            }
            fix = fixes.get(err.code, "retry later; ask the registrar's operator if it persists")
            raise RegistrationFailed(f"{where}: HTTP {err.code} {detail} — {fix}", err.code) from err
        except ssl.SSLCertVerificationError as err:
            raise RegistrationFailed(
                f"{where}: TLS certificate not trusted ({err.verify_message}) — set nadiki.ca_file to the CA that "
                "signed the registrar's certificate"
            ) from err
        except (OSError, urllib.error.URLError) as err:
            reason = getattr(err, "reason", None) or err
            raise RegistrationFailed(f"{where}: {reason} — check nadiki.registrar_url and the network path") from err
        try:
            return status, json.loads(raw) if raw else None
        except ValueError as err:
            raise RegistrationFailed(f"{where}: HTTP {status} but the body is not JSON ({raw[:80]!r})", status) from err

    def _registration(
        self, method: str, path: str, body: Mapping[str, Any] | None, expect: tuple[int, ...]
    ) -> Registration:
        status, document = self._request(method, path, body)
        where = f"NADIKI registrar {self.url}: {method} {path}"
        if status not in expect:
            raise RegistrationFailed(f"{where}: HTTP {status}, expected {' or '.join(map(str, expect))}", status)
        try:
            return parse_registration(document, where)
        except ValueError as err:
            raise RegistrationFailed(f"{err} — the registrar does not follow the NADIKI server API", status) from err

    def create(self, body: Mapping[str, Any]) -> Registration:
        return self._registration("POST", "/servers", body, (201, 200))

    def get(self, server_id: str) -> Registration:
        return self._registration("GET", f"/servers/{urllib.parse.quote(server_id, safe='')}", None, (200,))

    def update(self, server_id: str, body: Mapping[str, Any]) -> Registration:
        return self._registration("PUT", f"/servers/{urllib.parse.quote(server_id, safe='')}", body, (200,))


def _error_detail(raw: bytes) -> str:
    """The spec's Error object (code, message) when the body is one."""
    try:
        document = json.loads(raw)
    except ValueError:
        return raw[:200].decode("utf-8", "replace")
    if isinstance(document, dict) and "message" in document:
        return f"{document.get('code', '')}: {document['message']}".strip(": ")
    return raw[:200].decode("utf-8", "replace")


# --- state file -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    registrar: str
    server_id: str
    request: Mapping[str, Any]
    response: Mapping[str, Any]
    registered_at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "registrar": self.registrar,
            "id": self.server_id,
            "request": dict(self.request),
            "response": dict(self.response),
            "registered_at": self.registered_at,
        }


def load_state(path: str) -> State | None:
    """The stored registration, or None (no file; an unreadable file is moved aside and logged)."""
    try:
        with open(path, encoding="utf-8") as fh:
            document = json.load(fh)
        return State(
            str(document["registrar"]),
            str(document["id"]),
            dict(document["request"]),
            dict(document["response"]),
            float(document.get("registered_at", 0)),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        aside = f"{path}.corrupt"
        try:
            os.replace(path, aside)
        except OSError:
            aside = "(could not move it aside)"
        log.error("NADIKI state file %s is unreadable (%s); moved to %s, registering anew", path, err, aside)
        return None


def save_state(path: str, state: State) -> None:
    """Write atomically with mode 0600 (it holds the time-series token)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(state.to_json(), fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    os.replace(tmp, path)


def ensure_registration(
    client: RegistrarClient,
    description: ServerDescription,
    state_path: str,
    *,
    clock: Callable[[], float] = time.time,
) -> tuple[Registration, str]:
    """Register or reuse; return the registration and what was done (registered, reused, updated, stored)."""
    body = description.to_request()
    state = load_state(state_path)
    if state is not None:
        same_place = (state.request.get("facility_id"), state.request.get("rack_id")) == (
            description.facility_id,
            description.rack_id,
        )
        if state.registrar.rstrip("/") == client.url.rstrip("/") and same_place:
            try:
                if dict(state.request) != body:
                    try:
                        registration, action = client.update(state.server_id, body), "updated"
                    except RegistrationFailed as err:
                        if err.status not in (405, 501):
                            raise
                        log.warning(
                            "NADIKI registrar %s does not support PUT /servers/{id}; the stored description "
                            "stays as first registered",
                            client.url,
                        )
                        registration, action = client.get(state.server_id), "reused"
                else:
                    registration, action = client.get(state.server_id), "reused"
            except RegistrationFailed as err:
                if err.status == 404:
                    log.warning(
                        "NADIKI registrar %s no longer knows server %s; registering again", client.url, state.server_id
                    )
                elif err.status is None or err.status >= 500:
                    try:
                        stored = parse_registration(state.response, f"NADIKI state file {state_path}")
                    except ValueError as bad:
                        raise RegistrationFailed(
                            f"{err}; and the stored config cannot be used: {bad}", err.status
                        ) from err
                    log.warning("%s; pushing with the time-series config stored in %s", err, state_path)
                    return stored, "stored"
                else:
                    raise
            else:
                save_state(
                    state_path,
                    State(
                        client.url,
                        registration.server_id,
                        body if action == "updated" else state.request,
                        registration.raw,
                        state.registered_at,
                    ),
                )
                return registration, action
        else:
            log.warning(
                "NADIKI: server %s was registered with %s at %s/%s; now %s at %s/%s: registering anew",
                state.server_id,
                state.registrar,
                state.request.get("facility_id"),
                state.request.get("rack_id"),
                client.url,
                description.facility_id,
                description.rack_id,
            )
    registration = client.create(body)
    save_state(state_path, State(client.url, registration.server_id, body, registration.raw, clock()))
    return registration, "registered"


__all__ = ["RegistrarClient", "State", "ensure_registration", "load_state", "save_state"]
