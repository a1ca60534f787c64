"""Child processes of the e2e harness: started in their own session, tracked and stopped by
PID (an ``atexit`` hook and PR_SET_PDEATHSIG make sure none outlives Python), plus the small
helpers every component needs (a free port, waiting for a condition, running a command)."""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path


class ClusterError(RuntimeError):
    """A control-plane component failed to start or misbehaved."""


# --------------------------------------------------------------------------
# process bookkeeping
# --------------------------------------------------------------------------

_LIVE: dict[int, ManagedProcess] = {}
_LIVE_LOCK = threading.Lock()


def _pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _stop_all_live() -> None:
    with _LIVE_LOCK:
        procs = list(_LIVE.values())
    for p in procs:
        p.stop(timeout=5)


atexit.register(_stop_all_live)


def live_pids() -> list[int]:
    """PIDs of harness-started processes that have not been stopped yet."""
    with _LIVE_LOCK:
        return [pid for pid, p in _LIVE.items() if p.running]


def pid_alive(pid: int) -> bool:
    """True if a process with this PID exists (and is not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


class ManagedProcess:
    """A child process with its output in a log file, stopped by PID."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab", buffering=0)
        self._log.write(("$ " + " ".join(self.argv) + "\n").encode())
        preexec = _pdeathsig if sys.platform.startswith("linux") else None
        self.popen = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, env=dict(env) if env is not None else None,
            cwd=str(cwd) if cwd else None, start_new_session=True,
            preexec_fn=preexec)
        self.pid = self.popen.pid
        with _LIVE_LOCK:
            _LIVE[self.pid] = self

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM the PID, SIGKILL after ``timeout``; reaps it. Idempotent."""
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(timeout=10)
        with _LIVE_LOCK:
            _LIVE.pop(self.pid, None)
        if not self._log.closed:
            self._log.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} pid={self.pid} running={self.running}>"


# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------

def _run(argv: Sequence[str], cwd: Path) -> None:
    proc = subprocess.run([str(a) for a in argv], cwd=str(cwd),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"command failed: {' '.join(map(str, argv))}\n{proc.stdout}")


def _wait_until(pred, timeout: float, interval: float = 0.1, what: str = "condition",
                proc: ManagedProcess | None = None):
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        if proc is not None and not proc.running:
            raise ClusterError(
                f"{proc.name} exited with code {proc.returncode} while waiting for {what}; "
                f"log {proc.log_path}:\n{proc.log_tail()}")
        try:
            val = pred()
            if val:
                return val
        except Exception as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            msg = f"timed out after {timeout}s waiting for {what}"
            if last_exc is not None:
                msg += f" (last error: {last_exc!r})"
            if proc is not None:
                msg += f"; log {proc.log_path}:\n{proc.log_tail()}"
            raise ClusterError(msg)
        time.sleep(interval)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            body = r.read()
            if r.status != 200:
                return False
            try:
                return json.loads(body).get("health") in ("true", True)
            except ValueError:
                return True
    except (urllib.error.URLError, OSError):
        return False
