"""Logging what a request sent without letting it forge log lines or flood the log.

Everything from a request that reaches the log goes through :func:`escape` (control
characters, including newlines and terminal escapes, become ``\\n``, ``\\x1b``...), and
warnings about bad requests go through :class:`RateLimitedLog`: at most ``per_minute`` lines
per reason each minute, then one line saying how many were suppressed. The failures are still
all counted in the metrics.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\\]")
MAX_LOGGED_CHARS = 500


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    named = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char)
    if named is not None:
        return named
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def escape(text: str, limit: int = MAX_LOGGED_CHARS) -> str:
    """``text`` on one line, control characters escaped, cut to ``limit`` characters."""
    if len(text) > limit:
        text = text[:limit] + f"... ({len(text)} characters)"
    return _CONTROL.sub(_escaped, text)


class RateLimitedLog:
    """At most ``per_minute`` lines per reason in any minute-long window; the rest are counted."""

    def __init__(self, logger: logging.Logger, per_minute: int = 10, clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.per_minute = per_minute
        self.clock = clock
        self._windows: dict[str, list[float]] = {}  # reason -> [window start, lines, suppressed]
        self._lock = threading.Lock()

    def log(self, level: int, reason: str, message: str, *args: object) -> None:
        if not self.logger.isEnabledFor(level):
            return
        now = self.clock()
        with self._lock:
            window = self._windows.get(reason)
            suppressed = 0
            if window is None or now - window[0] >= 60.0:
                suppressed = int(window[2]) if window is not None else 0
                window = self._windows[reason] = [now, 0.0, 0.0]
            if window[1] >= self.per_minute:
                window[2] += 1
                return
            window[1] += 1
        if suppressed:
            self.logger.log(level, "%d more %s lines were suppressed in the last minute", suppressed, reason)
        self.logger.log(level, message, *(escape(a) if isinstance(a, str) else a for a in args))
