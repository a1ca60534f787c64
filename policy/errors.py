"""Errors of the policy package (see the hierarchy in ``policy/__init__.py``)."""

from __future__ import annotations


class PolicyError(Exception):
    """Root of every error raised by ``policy``."""


class ConfigError(PolicyError):
    """A document failed validation. ``problems`` holds every problem, each with its path.

    The message lists them all, one per line, so that a user fixes a file in one pass instead
    of one error per run::

        nodes.yaml: 2 problems
          nodes[1].cores: must be > 0, got -4
          policy.band: must be > 0, got 0
    """

    SHOWN = 40  # the message lists this many; ``problems`` keeps them all

    def __init__(self, where: str, problems: list[str]) -> None:
        self.where = where
        self.problems = list(problems)
        count = len(self.problems)
        head = f"{where}: {count} problem{'s' if count != 1 else ''}"
        lines = self.problems[: self.SHOWN]
        if count > self.SHOWN:
            lines.append(f"... and {count - self.SHOWN} more")
        super().__init__("\n  ".join([head, *lines]))
