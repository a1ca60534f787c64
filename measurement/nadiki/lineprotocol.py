"""InfluxDB line protocol, the format NADIKI's time-series endpoint takes (InfluxDB v2 ``/api/v2/write``).

One point per line::

    server,country_code=NLD,facility_id=FACILITY-NLD-001,rack_id=RACK-001,server_id=SERVER-1 server_energy_consumption_joules=9123.5 1767268800

Escaping (InfluxDB's "special characters" rules): in the measurement, commas and spaces; in tag
keys, tag values and field keys, commas, equals signs and spaces; a backslash is doubled
everywhere (two contiguous backslashes read as one literal backslash, so a doubled one is never
taken for an escape). Newlines cannot be represented and are refused, as are empty tag values,
keys beginning with ``_`` (reserved by InfluxDB) and non-finite numbers. Tags are written sorted
by key (what InfluxDB recommends for write performance). Fields are floats: a field keeps one
type for its whole life in a bucket, and energy here is never an integer.

Timestamps are integers in the write's precision (``s``, ``ms``, ``us`` or ``ns``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

PRECISIONS = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _check(text: str, what: str) -> None:
    if not text:
        raise ValueError(f"{what}: empty")
    if "\n" in text or "\r" in text:
        raise ValueError(f"{what} {text!r}: line protocol cannot carry a newline")


def escape_measurement(name: str) -> str:
    _check(name, "measurement")
    if name.startswith("_"):
        raise ValueError(f"measurement {name!r}: names beginning with '_' are reserved by InfluxDB")
    return name.replace("\\", "\\\\").replace(",", "\\,").replace(" ", "\\ ")


def escape_key(text: str, what: str = "key") -> str:
    """Escape a tag key, tag value or field key."""
    _check(text, what)
    return text.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def format_float(value: float) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"field value {value!r}: must be a finite number")
    return repr(float(value))


def to_timestamp(seconds: float, precision: str) -> int:
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: must be one of {', '.join(PRECISIONS)}")
    return round(seconds * PRECISIONS[precision])


@dataclass(frozen=True)
class Point:
    measurement: str
    tags: Mapping[str, str]
    fields: Mapping[str, float]
    timestamp: int  # in the write's precision

    def to_line(self) -> str:
        if not self.fields:
            raise ValueError(f"point {self.measurement!r}: at least one field is required")
        head = escape_measurement(self.measurement)
        for key in sorted(self.tags):
            if key.startswith("_"):
                raise ValueError(f"tag key {key!r}: keys beginning with '_' are reserved by InfluxDB")
            head += f",{escape_key(key, 'tag key')}={escape_key(self.tags[key], f'tag {key} value')}"
        fields = []
        for key in sorted(self.fields):
            if key.startswith("_"):
                raise ValueError(f"field key {key!r}: keys beginning with '_' are reserved by InfluxDB")
            fields.append(f"{escape_key(key, 'field key')}={format_float(self.fields[key])}")
        return f"{head} {','.join(fields)} {self.timestamp}"


__all__ = ["PRECISIONS", "Point", "escape_key", "escape_measurement", "format_float", "to_timestamp"]
