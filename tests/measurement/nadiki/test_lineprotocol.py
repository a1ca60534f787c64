"""Line protocol: InfluxDB's escaping rules, read back by an independent strict reader."""

from __future__ import annotations

import math

import pytest

from joulesched.measurement.nadiki.lineprotocol import Point, to_timestamp
from tests.measurement.nadiki.nadiki_support import parse_line

TAGS = {"facility_id": "FACILITY-NLD-001", "rack_id": "RACK-001", "server_id": "SERVER-1", "country_code": "NLD"}


def test_a_plain_point_is_one_line_with_sorted_tags() -> None:
    line = Point("server", TAGS, {"server_energy_consumption_joules": 9123.5}, 1767268800).to_line()
    assert line == (
        "server,country_code=NLD,facility_id=FACILITY-NLD-001,rack_id=RACK-001,server_id=SERVER-1 "
        "server_energy_consumption_joules=9123.5 1767268800"
    )


@pytest.mark.parametrize(
    ("measurement", "tags", "field", "escaped"),
    [
        ("server", {"rack_id": "Row 3, Rack 7"}, "f", r"server,rack_id=Row\ 3\,\ Rack\ 7 f="),
        ("server", {"server_id": "a=b"}, "f", r"server,server_id=a\=b f="),
        ("server", {"facility_id": "C:\\DC\\1"}, "f", r"server,facility_id=C:\\DC\\1 f="),
        ("server", {"x": "trailing\\"}, "f", "server,x=trailing\\\\ f="),
        ("my server,1", {"k": "v"}, "f", r"my\ server\,1,k=v f="),
        ("server", {"odd key=": "v"}, "cpu joules,x", r"server,odd\ key\==v cpu\ joules\,x="),
        ("server", {"ünïcode": "Zürich"}, "f", "server,ünïcode=Zürich f="),
    ],
    ids=[
        "spaces and commas in a tag value",
        "an equals sign in a tag value",
        "backslashes are doubled",
        "a trailing backslash cannot escape the separator",
        "space and comma in the measurement (equals sign is literal there)",
        "tag key and field key are escaped too",
        "UTF-8 passes unchanged",
    ],
)
def test_special_characters_are_escaped_and_read_back(
    measurement: str, tags: dict[str, str], field: str, escaped: str
) -> None:
    line = Point(measurement, tags, {field: 1.5}, 1767268800).to_line()
    assert line.startswith(escaped)
    parsed = parse_line(line)
    assert (parsed.measurement, parsed.tags, parsed.fields, parsed.timestamp) == (
        measurement,
        tags,
        {field: 1.5},
        1767268800,
    )


@pytest.mark.parametrize(
    ("point", "message"),
    [
        (Point("server", {"k": "two\nlines"}, {"f": 1.0}, 1), "newline"),
        (Point("server", {"k": ""}, {"f": 1.0}, 1), "empty"),
        (Point("_server", {}, {"f": 1.0}, 1), "reserved"),
        (Point("server", {"_k": "v"}, {"f": 1.0}, 1), "reserved"),
        (Point("server", {}, {"f": math.nan}, 1), "finite"),
        (Point("server", {}, {"f": math.inf}, 1), "finite"),
        (Point("server", {}, {}, 1), "at least one field"),
    ],
    ids=[
        "newline in a tag",
        "empty tag value",
        "measurement beginning with _",
        "tag key beginning with _",
        "NaN",
        "infinity",
        "no field",
    ],
)
def test_what_line_protocol_cannot_carry_is_refused(point: Point, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        point.to_line()


@pytest.mark.parametrize(
    ("value", "text"),
    [(7500.0, "7500.0"), (0.1, "0.1"), (1e21, "1e+21"), (3, "3.0"), (123456789.125, "123456789.125")],
    ids=[
        "whole joules stay a float",
        "a fraction",
        "large values in exponent form",
        "an int becomes a float",
        "full precision",
    ],
)
def test_fields_are_always_floats(value: float, text: str) -> None:
    line = Point("server", {}, {"f": value}, 1).to_line()
    assert line == f"server f={text} 1"
    assert parse_line(line).fields["f"] == float(value)


@pytest.mark.parametrize(
    ("precision", "expected"),
    [("s", 1767268830), ("ms", 1767268830_000), ("us", 1767268830_000_000), ("ns", 1767268830_000_000_000)],
)
def test_timestamp_precision(precision: str, expected: int) -> None:
    assert to_timestamp(1767268830.0, precision) == expected


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="precision 'h'"):
        to_timestamp(1.0, "h")
