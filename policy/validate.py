"""A small collector of validation problems with dotted paths.

Every document that joulesched reads (node profiles, sites, policy, extender and agent config)
is checked with a :class:`Checker`: each accessor records a problem instead of raising, so one
pass reports everything that is wrong, each with the path of the field (``nodes[2].cores``).
Numbers are never accepted as strings and invalid values are never silently replaced.

Config dataclasses declare each field once with :func:`setting` (kind, bounds, choices, a
one-line doc and the document key when it differs from the attribute); :func:`read_settings`
parses a mapping into such a dataclass with a :class:`Checker` and :func:`settings_table`
renders the Markdown reference of its fields. Adding a field is adding one ``setting(...)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar

from joulesched.policy.errors import ConfigError

_MISSING = object()
T = TypeVar("T")


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
        number = _as_float(value)
        if not math.isfinite(number):
            self.problem(where, f"must be finite, got {value!r:.40}")
            return None
        out_of_bounds = _bounds_problem(number, value, minimum, exclusive_minimum, maximum)
        if out_of_bounds is not None:
            self.problem(where, out_of_bounds)
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

    def integer(
        self, doc: Mapping[str, Any], key: str, path: str, *, minimum: int, default: int | None = None
    ) -> int | None:
        """Read a strict integer (``2.0`` is refused); ``None`` when absent or invalid."""
        value = doc.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(_join(path, key), f"must be an integer, got {value!r}")
            return None
        if value < minimum:
            self.problem(_join(path, key), f"must be >= {minimum}, got {value}")
            return None
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
            if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(_as_float(item)):
                self.problem(f"{where}[{i}]", f"must be a finite number, got {item!r:.40}")
                return None
            if minimum is not None and float(item) < minimum:
                self.problem(f"{where}[{i}]", f"must be >= {minimum:g}, got {item!r}")
                return None
            out.append(float(item))
        return out


def _as_float(value: int | float) -> float:
    """``float(value)``, where an integer too large for a float (YAML reads any digits) is inf."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _bounds_problem(
    number: float, shown: object, minimum: float | None, exclusive_minimum: float | None, maximum: float | None
) -> str | None:
    """The first bound ``number`` breaks, as a message (``shown`` is the value as given)."""
    if minimum is not None and number < minimum:
        return f"must be >= {minimum:g}, got {shown!r}"
    if exclusive_minimum is not None and number <= exclusive_minimum:
        return f"must be > {exclusive_minimum:g}, got {shown!r}"
    if maximum is not None and number > maximum:
        return f"must be <= {maximum:g}, got {shown!r}"
    return None


# -- config fields declared once ---------------------------------------------------------------

Kind = Literal["number", "whole", "integer", "string", "boolean", "section", "custom"]
SPEC = "joulesched.setting"  # the key of a field's Spec in dataclasses.field(metadata=...)


@dataclasses.dataclass(frozen=True)
class Spec:
    """How one config field is read, checked and documented.

    ``kind``: ``number`` (finite float; an ``int`` default gives an int), ``whole`` (a number
    that must be whole, read as int), ``integer`` (strictly an integer in the document),
    ``string``, ``boolean``, ``section`` (a nested settings dataclass, read recursively) or
    ``custom`` (structured: read by the owner's own code, here only for the allowed keys and
    the docs). ``key``: the dotted document path below the section when it differs from the
    attribute (``power_cap.headroom``). ``empty_ok``: ``""`` is a valid string. ``shown``: the
    default as the docs should show it, when the code's default does not say it. ``between``:
    out of ``minimum`` .. ``maximum`` reads "must be between A and B" (see :func:`limit_problems`).
    """

    kind: Kind
    doc: str
    key: str | None = None
    minimum: float | None = None
    exclusive_minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    empty_ok: bool = False
    shown: str | None = None
    between: bool = False


def setting(
    default: Any = _MISSING,
    doc: str = "",
    *,
    kind: Kind | None = None,
    key: str | None = None,
    minimum: float | None = None,
    exclusive_minimum: float | None = None,
    maximum: float | None = None,
    choices: Iterable[str] | None = None,
    empty_ok: bool = False,
    shown: str | None = None,
    between: bool = False,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A dataclass field with its :class:`Spec`; the kind follows the default's type unless given."""
    sample = factory() if factory is not None else default
    if kind is None:
        if choices is not None or isinstance(sample, str):
            kind = "string"
        elif isinstance(sample, bool):
            kind = "boolean"
        elif isinstance(sample, int):
            kind = "whole"
        elif isinstance(sample, float):
            kind = "number"
        elif dataclasses.is_dataclass(sample):
            kind = "section"
        else:
            raise TypeError(f"setting({default!r}): give kind=")
    spec = Spec(
        kind=kind,
        doc=doc,
        key=key,
        minimum=minimum,
        exclusive_minimum=exclusive_minimum,
        maximum=maximum,
        choices=tuple(choices) if choices is not None else None,
        empty_ok=empty_ok,
        shown=shown,
        between=between,
    )
    metadata = {SPEC: spec}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    if default is _MISSING:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def specs(cls: type[Any]) -> list[tuple[dataclasses.Field[Any], Spec]]:
    """The fields of a settings dataclass that carry a :class:`Spec`, in declaration order."""
    return [(f, f.metadata[SPEC]) for f in dataclasses.fields(cls) if SPEC in f.metadata]


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return _MISSING


def _section_class(f: dataclasses.Field[Any]) -> type[Any]:
    default = _default(f)
    if default is _MISSING or not dataclasses.is_dataclass(default):
        raise TypeError(f"section {f.name}: needs a dataclass default (factory=...)")
    return type(default)


_ZERO: dict[str, Any] = {"number": 0.0, "whole": 0, "integer": 0, "string": "", "boolean": False}


def _read_one(
    check: Checker, body: Mapping[str, Any], key: str, path: str, f: dataclasses.Field[Any], s: Spec, limits: bool
) -> Any:
    default = _default(f)
    wanted: Any = _MISSING if default is _MISSING else default
    value: Any
    if s.kind == "section":
        return read_settings(_section_class(f), body.get(key), check, _join(path, key), limits=limits)
    if s.kind == "string":
        if s.empty_ok and body.get(key) == "":
            return ""
        value = check.string(body, key, path, default=wanted, choices=s.choices if limits else None)
    elif s.kind == "boolean":
        return check.boolean(body, key, path, default=bool(default))
    elif s.kind == "integer":
        value = check.integer(body, key, path, minimum=int(s.minimum or 0) if limits else -(2**63), default=default)
    else:
        number = check.number(
            body,
            key,
            path,
            default=float(wanted) if isinstance(wanted, (int, float)) else wanted,
            minimum=s.minimum if limits else None,
            exclusive_minimum=s.exclusive_minimum if limits else None,
            maximum=s.maximum if limits else None,
        )
        if number is not None and s.kind == "whole" and number != int(number):
            check.problem(_join(path, key), f"must be a whole number, got {number:g}")  # read as int() below
        value = number
        if number is not None and (s.kind == "whole" or isinstance(default, int)):
            value = int(number)
    if value is None:
        if default is _MISSING:
            return _ZERO[s.kind]
        return default
    return value


def read_values(cls: type[Any], doc: Any, check: Checker, path: str = "", *, limits: bool = True) -> dict[str, Any]:
    """Read every non-custom field of ``cls`` from ``doc``; attribute -> value.

    Unknown keys are reported at every level of the document, custom fields' keys included;
    a value with a problem falls back to its default (the checker holds the problem). With
    ``limits=False`` only kinds are checked: bounds and choices are left to
    :func:`limit_problems` on the built object (configs that are also built in code).
    """
    body = check.mapping(doc, path)
    tree: dict[str, Any] = {}
    for f, s in specs(cls):
        node = tree
        parts = (s.key or f.name).split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = (f, s)
    values: dict[str, Any] = {}

    def walk(node: dict[str, Any], mapping: Mapping[str, Any], where: str) -> None:
        check.unknown_keys(mapping, node, where)
        for name, entry in node.items():
            if isinstance(entry, dict):
                walk(entry, check.mapping(mapping.get(name), _join(where, name)), _join(where, name))
                continue
            f, s = entry
            if s.kind != "custom":
                values[f.name] = _read_one(check, mapping, name, where, f, s, limits)

    walk(tree, body, path)
    return values


def read_settings(cls: type[T], doc: Any, check: Checker, path: str = "", *, limits: bool = True, **given: Any) -> T:
    """Parse ``doc`` into the settings dataclass ``cls``; ``given`` supplies the custom fields."""
    return cls(**read_values(cls, doc, check, path, limits=limits), **given)


def settings_document(settings: Any) -> dict[str, Any]:
    """The document :func:`read_settings` reads back as ``settings``: every declared field (custom
    ones left out) at its key, dotted keys as nested mappings, sections as their own documents."""
    doc: dict[str, Any] = {}
    for f, s in specs(type(settings)):
        if s.kind == "custom":
            continue
        value = getattr(settings, f.name)
        node = doc
        parts = (s.key or f.name).split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = settings_document(value) if s.kind == "section" else value
    return doc


def limit_problems(settings: Any, path: str = "") -> list[str]:
    """The bounds and choices problems of a built settings object, sections included."""
    problems: list[str] = []
    for f, s in specs(type(settings)):
        value = getattr(settings, f.name)
        where = _join(path, s.key or f.name)
        if s.kind == "section":
            problems += limit_problems(value, where)
            continue
        if s.kind in ("custom", "boolean") or value is None:
            continue
        if s.choices is not None:
            if value not in s.choices:
                problems.append(f"{where}: must be one of {', '.join(s.choices)}, got {value!r}")
            continue
        if s.kind == "string":
            continue
        low, high = s.minimum, s.maximum
        if s.between and low is not None and high is not None:
            if not low <= value <= high:
                problems.append(f"{where}: must be between {low:g} and {high:g}, got {value!r}")
            continue
        message = _bounds_problem(value, value, low, s.exclusive_minimum, high)
        if message is not None:
            problems.append(f"{where}: {message}")
    return problems


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"`{value}`" if value else '""'
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return "`[" + ", ".join(str(v) for v in value) + "]`"
    return str(value)


def _allowed(s: Spec) -> str:
    if s.choices is not None:
        return ", ".join(f"`{c}`" for c in s.choices)
    if s.kind == "boolean":
        return "true, false"
    if s.kind == "string":
        return "text"
    if s.kind in ("custom", "section"):
        return ""
    low = f"{s.minimum:g}" if s.minimum is not None else None
    if s.exclusive_minimum is not None:
        low = f"> {s.exclusive_minimum:g}"
    high = f"{s.maximum:g}" if s.maximum is not None else None
    whole = "whole, " if s.kind in ("whole", "integer") else ""
    if low is not None and high is not None:
        text = f"{low} … {high}" if not low.startswith(">") else f"{low}, <= {high}"
    elif low is not None:
        text = low if low.startswith(">") else f">= {low}"
    elif high is not None:
        text = f"<= {high}"
    else:
        return "whole number" if whole else "number"
    return f"{whole}{text}"


def settings_rows(cls: type[Any], prefix: str = "") -> list[str]:
    """One Markdown table row per field of ``cls`` (sections expanded), keys as in the document."""
    rows: list[str] = []
    for f, s in specs(cls):
        key = _join(prefix, s.key or f.name)
        if s.kind == "section" and s.shown is None:
            rows += settings_rows(_section_class(f), key)
            continue
        default = _default(f)
        shown = s.shown if s.shown is not None else ("— (required)" if default is _MISSING else _shown(default))
        rows.append(f"| `{key}` | {shown} | {_allowed(s)} | {s.doc} |")
    return rows


def settings_table(cls: type[Any], prefix: str = "") -> str:
    """The Markdown reference table of a settings dataclass."""
    head = ["| field | default | allowed | meaning |", "|---|---|---|---|"]
    return "\n".join(head + settings_rows(cls, prefix)) + "\n"
