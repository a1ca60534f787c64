"""A small collector of validation problems with dotted paths.

Every document that joulesched reads (node profiles, sites, policy, extender and agent config)
is checked with a :class:`Checker`: each accessor records a problem instead of raising, so one
pass reports everything that is wrong, each with the path of the field (``nodes[2].cores``).
Numbers are never accepted as strings and invalid values are never silently replaced.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from joulesched.policy.errors import ConfigError

_MISSING = object()


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, list):
        return "list"
    return type(value).__name__


class Checker:
    """Collects problems while reading a nested document."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.problems: list[str] = []

    def problem(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}" if path else message)

    def raise_if_any(self) -> None:
        if self.problems:
            raise ConfigError(self.where, self.problems)

    # -- structure ----------------------------------------------------------------------------

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.problem(path, f"must be a mapping, got {_type_name(value)}")
            return {}
        return value

    def unknown_keys(self, doc: Mapping[str, Any], allowed: Iterable[str], path: str) -> None:
        allowed_set = set(allowed)
        for key in doc:
            if key not in allowed_set:
                where = f"{path}.{key}" if path else str(key)
                self.problem(where, f"unknown field (allowed: {', '.join(sorted(allowed_set))})")

    def list_of(self, doc: Mapping[str, Any], key: str, path: str) -> list[Any]:
        value = doc.get(key, _MISSING)
        if value is _MISSING or value is None:
            return []
        if not isinstance(value, list):
            self.problem(_join(path, key), f"must be a list, got {_type_name(value)}")
            return []
        return value

    # -- scalars ------------------------------------------------------------------------------

    def number(
        self,
        doc: Mapping[str, Any],
        key: str,
        path: str,
        *,
        default: float | object | None = _MISSING,
        minimum: float | None = None,
        exclusive_minimum: float | None = None,
        maximum: float | None = None,
    ) -> float | None:
        """Read a finite number; record a problem (and return ``None``) when it is not one."""
        where = _join(path, key)
        value = doc.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                self.problem(where, "is required")
                return None
            return default  # type: ignore[return-value]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.problem(where, f"must be a number, got {_type_name(value)} {value!r}")
            return None
        number = float(value)
        if not math.isfinite(number):
            self.problem(where, f"must be finite, got {value!r}")
            return None
        if minimum is not None and number < minimum:
            self.problem(where, f"must be >= {minimum:g}, got {value!r}")
            return None
        if exclusive_minimum is not None and number <= exclusive_minimum:
            self.problem(where, f"must be > {exclusive_minimum:g}, got {value!r}")
            return None
        if maximum is not None and number > maximum:
            self.problem(where, f"must be <= {maximum:g}, got {value!r}")
            return None
        return number

    def string(
        self,
        doc: Mapping[str, Any],
        key: str,
        path: str,
        *,
        default: str | object | None = _MISSING,
        choices: Iterable[str] | None = None,
    ) -> str | None:
        where = _join(path, key)
        value = doc.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                self.problem(where, "is required")
                return None
            return default  # type: ignore[return-value]
        if not isinstance(value, str) or not value:
            self.problem(where, f"must be a non-empty string, got {_type_name(value)} {value!r}")
            return None
        if choices is not None:
            options = list(choices)
            if value not in options:
                self.problem(where, f"must be one of {', '.join(options)}, got {value!r}")
                return None
        return value

    def boolean(self, doc: Mapping[str, Any], key: str, path: str, *, default: bool) -> bool:
        value = doc.get(key, _MISSING)
        if value is _MISSING or value is None:
            return default
        if not isinstance(value, bool):
            self.problem(_join(path, key), f"must be true or false, got {_type_name(value)} {value!r}")
            return default
        return value

    def numbers(
        self, doc: Mapping[str, Any], key: str, path: str, *, length: int | None = None, minimum: float | None = None
    ) -> list[float] | None:
        where = _join(path, key)
        value = doc.get(key, _MISSING)
        if value is _MISSING or value is None:
            return None
        if not isinstance(value, list):
            self.problem(where, f"must be a list of numbers, got {_type_name(value)}")
            return None
        if length is not None and len(value) != length:
            self.problem(where, f"must have {length} entries, got {len(value)}")
            return None
        out: list[float] = []
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(float(item)):
                self.problem(f"{where}[{i}]", f"must be a finite number, got {item!r}")
                return None
            if minimum is not None and float(item) < minimum:
                self.problem(f"{where}[{i}]", f"must be >= {minimum:g}, got {item!r}")
                return None
            out.append(float(item))
        return out


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
