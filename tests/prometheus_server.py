"""A real Prometheus server on loopback for tests (Debian's ``prometheus`` package).

``ExpositionServer`` serves a text exposition that a test can change; ``PrometheusServer``
starts ``prometheus`` scraping it every second with its data in a temporary directory and
stops it (by PID) when the test ends. Without the binary, tests skip — except under CI,
where a missing prerequisite is a failure.
"""

from __future__ import annotations

import http.server
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import yaml

from joulesched.contracts.net import free_port
from tests import support


def require(binary: str) -> str:
    return support.require(binary, "hack/test.sh installs Debian's prometheus package")


class ExpositionServer:
    """Serves ``self.text`` at /metrics on a free loopback port."""

    def __init__(self, text: str = "") -> None:
        self.text = text
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class PrometheusServer:
    def __init__(
        self,
        workdir: Path,
        targets: list[str],
        rule_files: list[str] | None = None,
        interval: str = "1s",
        scrape_configs: list[dict[str, Any]] | None = None,
    ) -> None:
        """Scrapes ``targets`` (job ``joulesched-agent``, deploy/agent's), or runs ``scrape_configs`` as given instead."""
        self.binary = require("prometheus")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": rule_files or [],
            "scrape_configs": scrape_configs
            if scrape_configs is not None
            else [{"job_name": "joulesched-agent", "static_configs": [{"targets": targets}]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-admin-api",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=self.log,
            stderr=self.log,
        )
        self.workdir = workdir
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        support.wait_ready(self.proc, f"{self.url}/-/ready", self.workdir / "prometheus.log", "prometheus", timeout)

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=5) as reply:
            result: list[dict[str, Any]] = orjson.loads(reply.read())["data"]["result"]
            return result

    def wait_for(self, promql: str, count: int = 1, timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if len(result) >= count:
                return result
            time.sleep(0.3)
        raise AssertionError(f"{promql!r}: {len(result)} series after {timeout:.0f} s, wanted {count}")

    def stop(self) -> None:
        support.stop_process(self.proc)
        self.log.close()


def prometheus_scraping(
    tmp_path: Path, text: str, rule_files: list[str] | None = None
) -> Iterator[tuple[PrometheusServer, ExpositionServer]]:
    exposition = ExpositionServer(text)
    server = None
    try:
        server = PrometheusServer(tmp_path / "prometheus", [f"127.0.0.1:{exposition.port}"], rule_files)
        yield server, exposition
    finally:
        if server is not None:
            server.stop()
        exposition.close()
