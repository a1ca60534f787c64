"""A progress bar on stderr: drawn in place on a terminal, else a line now and then once slow.

On a TTY the bar is redrawn at most ten times a second. Elsewhere (CI logs, pipes) nothing is
printed for the first ``quiet_seconds``; a run that lasts longer prints one plain line every
``line_seconds``, so short runs and tests stay silent.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        quiet_seconds: float = 3.0,
        line_seconds: float = 5.0,
    ) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.quiet = quiet_seconds
        self.every = line_seconds
        self.started = time.monotonic()
        self._last = -1e9
        self._drawn = False
        self._label = ""

    def __call__(self, label: str, fraction: float) -> None:
        now = time.monotonic()
        fraction = min(max(fraction, 0.0), 1.0)
        if self.tty:
            if label != self._label and self._drawn:
                self.stream.write("\n")
            elif now - self._last < 0.1 and fraction < 1.0:
                return
            self._label = label
            width = 30
            filled = round(fraction * width)
            bar = "#" * filled + "-" * (width - filled)
            self.stream.write(f"\r  {label:<16} [{bar}] {fraction:6.1%}  {now - self.started:6.1f} s")
            self.stream.flush()
            self._drawn = True
        else:
            if now - self.started < self.quiet or now - self._last < self.every:
                return
            self.stream.write(f"  {label}: {fraction:.0%} ({now - self.started:.0f} s)\n")
            self.stream.flush()
        self._last = now

    def done(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
