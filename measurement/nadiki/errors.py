"""Errors of NADIKI provider mode (hierarchy in ``measurement/nadiki/__init__.py``)."""

from __future__ import annotations

from joulesched.measurement.errors import MeasurementError


class NadikiError(MeasurementError):
    """Root of the errors of provider mode."""


class RegistrationFailed(NadikiError):
    """The registrar refused the server, answered something the spec does not allow, or could not be
    reached; the message names the registrar, the request and what to do."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PushFailed(NadikiError):
    """A write to the time-series endpoint failed. ``retry`` says whether the same lines may be sent
    again later (network, 429, 5xx) or must be dropped (400: malformed, never accepted)."""

    def __init__(
        self, message: str, status: int | None = None, *, retry: bool, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry = retry
        self.retry_after = retry_after
