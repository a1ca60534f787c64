"""Small helpers shared by the trace readers: typed field access that names what is wrong."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from joulesched.policy.demand import QuantityError, parse_quantity
from joulesched.sim.errors import TraceError

MIB = 1024.0**2


class Fields:
    """Read one record's fields; every failure raises a ``TraceError`` naming file, record, field."""

    def __init__(self, path: str, record: str, row: Mapping[str, Any]) -> None:
        self.path = path
        self.record = record
        self.row = row

    def fail(self, field: str, problem: str) -> TraceError:
        return TraceError(self.path, self.record, field, problem)

    def has(self, field: str) -> bool:
        value = self.row.get(field)
        return value is not None and not (isinstance(value, str) and value.strip() in ("", "-"))

    def number(
        self,
        field: str,
        *,
        default: float | None = None,
        minimum: float | None = 0.0,
        required: bool = False,
    ) -> float:
        if not self.has(field):
            if required or default is None:
                raise self.fail(field, "is required")
            return default
        raw = self.row[field]
        if isinstance(raw, bool):
            raise self.fail(field, f"must be a number, got {raw!r}")
        if isinstance(raw, (int, float)):
            value = float(raw)
        else:
            try:
                value = float(str(raw).strip())
            except ValueError as err:
                raise self.fail(field, f"must be a number, got {raw!r}") from err
        if not math.isfinite(value):
            raise self.fail(field, f"must be finite, got {raw!r}")
        if minimum is not None and value < minimum:
            raise self.fail(field, f"must be >= {minimum:g}, got {raw!r}")
        return value

    def quantity(self, field: str, *, default: float = 0.0) -> float:
        """A Kubernetes quantity (``500m``, ``2``, ``1Gi``) or a plain number."""
        if not self.has(field):
            return default
        raw = self.row[field]
        try:
            if isinstance(raw, str):
                text = raw.strip()
                try:
                    return _non_negative(float(text), raw)
                except ValueError:
                    return parse_quantity(text, field)
            return parse_quantity(raw, field)
        except (QuantityError, ValueError) as err:
            raise self.fail(field, str(err).removeprefix(f"{field}: ")) from err

    def text(self, field: str, *, default: str = "") -> str:
        if not self.has(field):
            return default
        return str(self.row[field]).strip()

    def integer(self, field: str, *, default: int = 0) -> int:
        value = self.number(field, default=float(default))
        if value != int(value):
            raise self.fail(field, f"must be a whole number, got {self.row[field]!r}")
        return int(value)


def read_text(path: str) -> str:
    """A trace file's text; a ``TraceError`` naming the file when it cannot be read or is not UTF-8."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise TraceError(path, "", "", f"cannot read: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise TraceError(path, "", "", f"not UTF-8 text: {err}") from err


def _non_negative(value: float, raw: Any) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"must be a finite number >= 0, got {raw!r}")
    return value


def round_up_mib(nbytes: float) -> float:
    """Bytes rounded up to whole MiB (how a request derived from a peak is written)."""
    return math.ceil(nbytes / MIB) * MIB if nbytes > 0 else 0.0
