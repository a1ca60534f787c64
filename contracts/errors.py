"""Errors of the contracts package (hierarchy in ``contracts/__init__.py``)."""

from __future__ import annotations


class ContractError(Exception):
    """Root of the errors ``contracts`` defines (documents that fail validation raise
    :class:`policy.errors.ConfigError` instead, see ``contracts/__init__.py``)."""


class SeriesFileError(ContractError):
    """Problems of one series file (collected, then reported by the caller under its path)."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(f"{path}: " + "; ".join(problems))


class NadikiReadError(ContractError):
    """Reading the NADIKI side back failed: the registrar or the time-series store refused,
    is unreachable or answered something that is not what the spec or InfluxDB's API says."""


__all__ = ["ContractError", "NadikiReadError", "SeriesFileError"]
