"""Errors of the extender package (hierarchy in ``extender/__init__.py``)."""

from __future__ import annotations


class ExtenderError(Exception):
    """Root of every error raised by ``extender``."""


class WireError(ExtenderError, ValueError):
    """A request body that is not a valid extender message; the message names the field."""


class BindDisabled(ExtenderError):
    """The bind verb was called but is not enabled."""


class LeftToScheduler(ExtenderError):
    """``bind.write: false``: the placement is recorded and the binding is kube-scheduler's to write."""


class ExpanderError(ExtenderError):
    """``joulesched expander``: bad input or settings (exit status 2)."""


class DeferrerError(ExtenderError):
    """``joulesched deferrer``: bad input or settings (exit status 2)."""


__all__ = ["BindDisabled", "DeferrerError", "ExpanderError", "ExtenderError", "LeftToScheduler", "WireError"]
