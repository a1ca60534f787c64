"""A real InfluxDB 1.x on loopback for tests (Debian's ``influxdb`` package, ``influxd``).

``InfluxServer`` writes a temporary config (HTTP and RPC on free loopback ports, data under the
test's directory, no reporting, no self-monitoring) and stops the daemon by PID when the test
ends. Without the binary, tests skip — except under CI, where a missing prerequisite fails.
"""

from __future__ import annotations

import base64
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from joulesched.contracts.net import free_port
from tests import support

CONFIG = """\
reporting-disabled = true
bind-address = "127.0.0.1:{rpc}"
[meta]
  dir = "{dir}/meta"
[data]
  dir = "{dir}/data"
  wal-dir = "{dir}/wal"
  query-log-enabled = false
[http]
  bind-address = "127.0.0.1:{http}"
  log-enabled = false
  max-row-limit = 0
  auth-enabled = {auth}
[monitor]
  store-enabled = false
[continuous_queries]
  enabled = false
"""


class InfluxServer:
    """``credentials``: start with authentication on and that admin user (InfluxDB lets the
    first user be created without credentials); every request of the fixture then sends them."""

    def __init__(self, workdir: Path, credentials: tuple[str, str] | None = None) -> None:
        self.binary = support.require("influxd", "hack/test.sh installs Debian's influxdb package")
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        auth = "true" if credentials else "false"
        (workdir / "influxdb.conf").write_text(CONFIG.format(rpc=free_port(), http=self.port, dir=workdir, auth=auth))
        self.credentials: tuple[str, str] | None = None  # set once the user exists
        self.workdir = workdir
        self.log = (workdir / "influxd.log").open("wb")
        self.proc = subprocess.Popen(
            [self.binary, "-config", str(workdir / "influxdb.conf")], stdout=self.log, stderr=self.log
        )
        self._wait_ready()
        if credentials:
            user, password = credentials
            self.query(f"CREATE USER \"{user}\" WITH PASSWORD '{password}' WITH ALL PRIVILEGES")
            self.credentials = credentials

    def _wait_ready(self) -> None:
        support.wait_ready(self.proc, f"{self.url}/ping", self.workdir / "influxd.log", "influxd")

    def query(self, influxql: str, database: str = "") -> dict[str, Any]:
        params = urllib.parse.urlencode({"q": influxql, "db": database, "epoch": "s"})
        request = self._authorised(urllib.request.Request(f"{self.url}/query", data=params.encode(), method="POST"))
        with urllib.request.urlopen(request, timeout=10) as reply:
            answer: dict[str, Any] = orjson.loads(reply.read())
            return answer

    def _authorised(self, request: urllib.request.Request) -> urllib.request.Request:
        if self.credentials:
            token = base64.b64encode(":".join(self.credentials).encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        return request

    def create_database(self, name: str) -> None:
        escaped = name.replace("\\", "\\\\").replace('"', '\\"')
        self.query(f'CREATE DATABASE "{escaped}"')

    def write(self, database: str, lines: Sequence[str], precision: str = "s") -> None:
        """InfluxDB 1.x ``/write``: the body is line protocol, exactly as a v2 write carries it."""
        params = urllib.parse.urlencode({"db": database, "precision": precision})
        body = ("\n".join(lines) + "\n").encode()
        request = self._authorised(urllib.request.Request(f"{self.url}/write?{params}", data=body, method="POST"))
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                assert reply.status == 204, reply.status
        except urllib.error.HTTPError as err:
            raise AssertionError(f"influxd refused the lines: {err.code} {err.read()[:300]!r}") from err

    def stop(self) -> None:
        support.stop_process(self.proc)
        self.log.close()
