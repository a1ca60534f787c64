"""Helpers shared by the test folders: a clock the test moves, a free loopback port, the real
tools a test needs, and a peer that trickles its bytes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from joulesched.contracts.net import free_port


def require(binary: str, installed_by: str) -> str:
    """The path of ``binary``; missing, the test fails in CI (which installs it) and is skipped elsewhere."""
    path = shutil.which(binary)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{binary} is not installed ({installed_by} in CI)")
        pytest.skip(f"{binary} is not installed ({installed_by})")
    return path


class Clock:
    """A clock that moves only when the test says so (``now`` is read by calling it)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, name: str, timeout: float = 30.0) -> None:
    """Poll ``url`` until it answers 2xx; fail with the log's tail if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if 200 <= reply.status < 300:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{name} did not become ready")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a server the test started (by its PID), killing it after 15 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


__all__ = ["Clock", "free_port", "require", "stop_process", "wait_ready"]


def trickle(sock: socket.socket, stop: threading.Event, every: float, times: int | None = None) -> None:
    """Send ``sock`` a blank every ``every`` seconds until ``stop`` is set, ``times`` blanks
    are sent (None: no end) or the peer is gone: a client or server that is slow, not silent."""
    sent = 0
    while (times is None or sent < times) and not stop.wait(every):
        try:
            sock.sendall(b" ")
        except OSError:
            return
        sent += 1
