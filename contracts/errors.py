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


class CarbonApiError(ContractError):
    """A carbon-intensity API request failed: transport, deadline, HTTP status (``status``) or the
    shape of its JSON. Caught by the live source, which keeps its last data (``carbon_apis``)."""

    def __init__(self, message: str, *, status: int = 0, retry_after: float | None = None) -> None:
        self.status = status
        self.retry_after = retry_after  # seconds the provider asked to wait (429/503 Retry-After)
        super().__init__(message)


class NadikiReadError(ContractError):
    """Reading the NADIKI side back failed: the registrar or the time-series store refused,
    is unreachable or answered something that is not what the spec or InfluxDB's API says."""


__all__ = ["CarbonApiError", "ContractError", "NadikiReadError", "SeriesFileError"]
