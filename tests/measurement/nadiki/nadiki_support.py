"""Helpers of the NADIKI tests: the spec's schemas, a strict line-protocol reader, and a loopback
server playing both the registrar (``/servers``) and the InfluxDB v2 endpoint (``/api/v2/write``)."""

from __future__ import annotations

import copy
import http.server
import json
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

SPEC_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "nadiki"
SERVER_SPEC = SPEC_DIR / "server-api.spec.yaml"

needs_spec = pytest.mark.skipif(not SERVER_SPEC.is_file(), reason=f"NADIKI spec not at {SERVER_SPEC}")


def load_spec(*, fix_patterns: bool = False) -> dict[str, Any]:
    """The server API spec. ``fix_patterns`` strips the ``/…/`` delimiters the spec writes around
    its regular expressions (JSON Schema patterns have none: as written, no valid field matches)."""
    spec = yaml.safe_load(SERVER_SPEC.read_text())
    if fix_patterns:

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                pattern = node.get("pattern")
                if isinstance(pattern, str) and len(pattern) > 1 and pattern.startswith("/") and pattern.endswith("/"):
                    node["pattern"] = pattern[1:-1]
                for value in node.values():
                    walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)

        walk(spec)
    return spec


def validator(schema_name: str, *, fix_patterns: bool = False) -> Any:
    """A Draft 4 validator (OpenAPI 3.0's schema dialect) for components/schemas/<name>, $refs resolved."""
    import jsonschema
    import referencing
    from referencing.jsonschema import DRAFT4

    spec = load_spec(fix_patterns=fix_patterns)
    resource = referencing.Resource.from_contents(spec, default_specification=DRAFT4)
    registry = referencing.Registry().with_resource("urn:nadiki:server-api", resource)
    return jsonschema.Draft4Validator(
        {"$ref": f"urn:nadiki:server-api#/components/schemas/{schema_name}"}, registry=registry
    )


def schema_errors(schema_name: str, document: Any, *, fix_patterns: bool = False) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator(schema_name, fix_patterns=fix_patterns).iter_errors(document)
    ]


def undeclared_keys(schema_name: str, document: Any) -> list[str]:
    """Keys the document sends that the schema does not declare (the spec allows extra keys, so
    jsonschema alone would not catch a misspelt optional field)."""
    spec = load_spec()
    schemas = spec["components"]["schemas"]

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        if "$ref" in node:
            return resolve(schemas[node["$ref"].rsplit("/", 1)[-1]])
        if "allOf" in node:
            merged: dict[str, Any] = {"properties": {}}
            for part in node["allOf"]:
                merged["properties"].update(resolve(part).get("properties", {}))
            return merged
        return node

    problems: list[str] = []

    def walk(schema: dict[str, Any], value: Any, path: str) -> None:
        schema = resolve(schema)
        if isinstance(value, dict) and "properties" in schema:
            for key, item in value.items():
                if key not in schema["properties"]:
                    problems.append(f"{path}{key}")
                else:
                    walk(schema["properties"][key], item, f"{path}{key}.")
        elif isinstance(value, list) and "items" in schema:
            for i, item in enumerate(value):
                walk(schema["items"], item, f"{path}{i}.")

    walk(schemas[schema_name], document, "")
    return problems


# --- line protocol, read strictly and independently of the code under test -----------------------

_ESCAPED = {"\\\\": "\\", "\\,": ",", "\\=": "=", "\\ ": " ", '\\"': '"'}


def _split(text: str, separator: str) -> list[str]:
    """Split at separators that are not escaped by a backslash."""
    parts, current, i = [], "", 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            current += text[i : i + 2]
            i += 2
            continue
        if text[i] == separator:
            parts.append(current)
            current = ""
        else:
            current += text[i]
        i += 1
    parts.append(current)
    return parts


def _unescape(text: str) -> str:
    out, i = "", 0
    while i < len(text):
        pair = text[i : i + 2]
        if pair in _ESCAPED:
            out += _ESCAPED[pair]
            i += 2
        else:
            out += text[i]
            i += 1
    return out


@dataclass(frozen=True)
class ParsedLine:
    measurement: str
    tags: dict[str, str]
    fields: dict[str, float]
    timestamp: int


def parse_line(line: str) -> ParsedLine:
    """Strict InfluxDB line protocol: measurement[,tag=v...] field=v[,...] timestamp (floats only)."""
    sections = _split(line, " ")
    assert len(sections) == 3, f"expected 3 space-separated sections, got {len(sections)}: {line!r}"
    head, fields_text, stamp = sections
    assert re.fullmatch(r"-?\d+", stamp), f"timestamp is not an integer: {stamp!r}"
    parts = _split(head, ",")
    tags: dict[str, str] = {}
    for part in parts[1:]:
        kv = _split(part, "=")
        assert len(kv) == 2 and kv[0] and kv[1], f"bad tag {part!r} in {line!r}"
        tags[_unescape(kv[0])] = _unescape(kv[1])
    keys = [k for k in (_split(p, "=")[0] for p in parts[1:])]
    assert keys == sorted(keys), f"tags not sorted by key: {line!r}"
    fields: dict[str, float] = {}
    for part in _split(fields_text, ","):
        kv = _split(part, "=")
        assert len(kv) == 2, f"bad field {part!r}"
        assert re.fullmatch(r"-?(\d+\.\d*|\d*\.\d+|\d+)([eE][-+]?\d+)?", kv[1]) and not kv[1].endswith("i"), (
            f"field {kv[0]!r} is not a float: {kv[1]!r}"
        )
        fields[_unescape(kv[0])] = float(kv[1])
    return ParsedLine(_unescape(parts[0]), tags, fields, int(stamp))


# --- the registrar and the time-series endpoint on loopback ---------------------------------------

PRECISION_DIGITS = {"s": 10, "ms": 13, "us": 16, "ns": 19}  # digits of a 2001..2286 timestamp


@dataclass
class Registrar:
    """State of the fake registrar + InfluxDB endpoint; tests read and steer it."""

    country_code: str = "NLD"
    granularity: int = 30
    fields: tuple[str, ...] = ("server_energy_consumption_joules", "cpu_energy_consumption_joules")
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)  # (method, path, body)
    body_errors: list[str] = field(default_factory=list)  # schema violations of request bodies
    token: str = "token-1"
    write_failures: list[tuple[int, dict[str, str]]] = field(default_factory=list)  # answers to send first
    lines: list[ParsedLine] = field(default_factory=list)
    raw_writes: list[str] = field(default_factory=list)
    line_errors: list[str] = field(default_factory=list)
    writes: list[dict[str, str]] = field(default_factory=list)  # query of each accepted write
    down: bool = False  # answer 503 to /servers
    endpoint: str = ""  # the time-series endpoint handed out (default: this server's own /api/v2/write)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def response_for(self, server_id: str, body: dict[str, Any], endpoint: str) -> dict[str, Any]:
        tags = {
            "facility_id": body["facility_id"],
            "rack_id": body["rack_id"],
            "server_id": server_id,
            "country_code": self.country_code,
        }
        return {
            **copy.deepcopy(body),
            "id": server_id,
            "timeSeriesConfig": {
                "endpoint": endpoint,
                "org": "leitmotiv",
                "bucket": "nadiki servers",
                "token": self.token,
                "dataPoints": [
                    {"measurement": "server", "field": f, "granularitySeconds": self.granularity, "tags": dict(tags)}
                    for f in self.fields
                ],
            },
            "createdAt": "2026-01-01T00:00:00Z",
            "updatedAt": "2026-01-01T00:00:00Z",
        }


class RegistrarServer:
    def __init__(self, state: Registrar | None = None) -> None:
        self.state = state or Registrar()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))

            def reply(self, status: int, document: Any = None, headers: dict[str, str] | None = None) -> None:
                data = b"" if document is None else json.dumps(document).encode()
                self.send_response(status)
                if document is not None:
                    self.send_header("Content-Type", "application/json")
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                raw = self.body()
                if url.path == "/v1/servers":
                    return outer.create(self, json.loads(raw))
                if url.path == "/api/v2/write":
                    return outer.write(self, urllib.parse.parse_qs(url.query), raw)
                self.reply(404, {"code": "not_found", "message": self.path})

            def do_GET(self) -> None:
                outer.get(self)

            def do_PUT(self) -> None:
                outer.put(self, json.loads(self.body()))

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def registrar_url(self) -> str:
        return f"{self.base}/v1"

    def __enter__(self) -> RegistrarServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    # -- registrar --
    def create(self, handler: Any, body: dict[str, Any]) -> None:
        s = self.state
        with s.lock:
            s.requests.append(("POST", "/servers", body))
            if s.down:
                return handler.reply(503, {"code": "unavailable", "message": "maintenance"})
            errors = schema_errors("ServerCreate", body) + [
                f"undeclared {k}" for k in undeclared_keys("ServerCreate", body)
            ]
            s.body_errors += errors
            if errors:
                return handler.reply(400, {"code": "invalid", "message": "; ".join(errors)})
            server_id = f"SERVER-{body['facility_id']}-{body['rack_id']}-{len(s.servers) + 1:03d}"
            s.servers[server_id] = s.response_for(server_id, body, s.endpoint or self.base)
            handler.reply(201, s.servers[server_id])

    def get(self, handler: Any) -> None:
        s = self.state
        server_id = urllib.parse.unquote(handler.path.rsplit("/", 1)[-1])
        with s.lock:
            s.requests.append(("GET", handler.path, None))
            if s.down:
                return handler.reply(503, {"code": "unavailable", "message": "maintenance"})
            if server_id not in s.servers:
                return handler.reply(404, {"code": "not_found", "message": f"server {server_id} not found"})
            s.servers[server_id]["timeSeriesConfig"]["token"] = s.token  # tokens rotate
            handler.reply(200, s.servers[server_id])

    def put(self, handler: Any, body: dict[str, Any]) -> None:
        s = self.state
        server_id = urllib.parse.unquote(handler.path.rsplit("/", 1)[-1])
        with s.lock:
            s.requests.append(("PUT", handler.path, body))
            errors = schema_errors("ServerUpdate", body) + [
                f"undeclared {k}" for k in undeclared_keys("ServerUpdate", body)
            ]
            s.body_errors += errors
            if server_id not in s.servers:
                return handler.reply(404, {"code": "not_found", "message": server_id})
            s.servers[server_id] = s.response_for(server_id, body, s.endpoint or self.base)
            handler.reply(200, s.servers[server_id])

    # -- InfluxDB v2 write --
    def write(self, handler: Any, query: dict[str, list[str]], raw: bytes) -> None:
        s = self.state
        with s.lock:
            if s.write_failures:
                status, headers = s.write_failures.pop(0)
                return handler.reply(status, {"code": "err", "message": f"planned {status}"}, headers)
            if handler.headers.get("Authorization") != f"Token {s.token}":
                return handler.reply(401, {"code": "unauthorized", "message": "unauthorized access"})
            if handler.headers.get("Content-Type", "").split(";")[0] != "text/plain":
                s.line_errors.append(f"content type {handler.headers.get('Content-Type')}")
            flat = {k: v[0] for k, v in query.items()}
            precision = flat.get("precision", "ns")
            if flat.get("org") != "leitmotiv" or flat.get("bucket") != "nadiki servers":
                s.line_errors.append(f"org/bucket {flat}")
            text = raw.decode("utf-8")
            s.raw_writes.append(text)
            for line in text.splitlines():
                if not line:
                    continue
                try:
                    parsed = parse_line(line)
                except AssertionError as err:
                    s.line_errors.append(str(err))
                    continue
                if len(str(parsed.timestamp)) != PRECISION_DIGITS[precision]:
                    s.line_errors.append(f"timestamp {parsed.timestamp} does not have precision {precision}")
                s.lines.append(parsed)
            s.writes.append(flat)
            handler.reply(204)
