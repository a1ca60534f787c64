"""Errors of the simulator (see the hierarchy in ``sim/__init__.py``)."""

from __future__ import annotations


class SimError(Exception):
    """Root of every error raised by ``sim``."""


class TraceError(SimError):
    """A trace file is malformed. The message names the file, the record and the field."""

    def __init__(self, path: str, record: str, field: str, problem: str) -> None:
        self.path = path
        self.record = record
        self.field = field
        self.problem = problem
        where = f"{path}: {record}" if record else path
        super().__init__(f"{where}: field {field!r}: {problem}" if field else f"{where}: {problem}")


class ClusterError(SimError):
    """A cluster spec or a file it refers to is invalid (``problems`` lists every problem)."""

    def __init__(self, where: str, problems: list[str]) -> None:
        self.where = where
        self.problems = list(problems)
        count = len(self.problems)
        head = f"{where}: {count} problem{'s' if count != 1 else ''}"
        super().__init__("\n  ".join([head, *self.problems]))


class ExtenderCallError(SimError):
    """A call to a running extender over HTTP failed or answered something unusable."""
