"""Site files and carbon series files: what is read, and every malformed file rejected with its field named."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import yaml

from joulesched.contracts.sitefile import (
    FileIntensity,
    SeriesFileError,
    load_site_file,
    parse_site_document,
    read_intensity_csv,
)
from joulesched.policy.errors import ConfigError
from joulesched.policy.site import (
    ConstantIntensity,
    IntensitySeries,
    IntensityUnavailable,
    Location,
    ServerEmbodied,
    WithFallback,
)

ROOT = Path(__file__).resolve().parents[2]
CISO = ROOT / "sim" / "data" / "carbon" / "eia_2022_CISO_hourly.csv"  # the project's copy (US EIA via dc-rl, MIT)
T0 = 1654041600.0  # 2022-06-01T00:00:00Z

FACILITY = {  # a NADIKI FacilityResponse, as the registrar returns it
    "id": "FACILITY-USA-001",
    "countryCode": "USA",
    "location": {"latitude": 45.6, "longitude": -121.2},
    "designPue": 1.1,
    "description": "hydro-powered hall",
    "embeddedGhgEmissionsFacility": 12000.0,
    "lifetimeFacility": 15,
    "timeSeriesConfig": {
        "endpoint": "https://ts.example:8086",
        "org": "o",
        "bucket": "b",
        "token": "t",
        "dataPoints": [],
    },
}


def csv_file(tmp_path: Path, rows: list[str], name: str = "carbon.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(["timestamp,avg_CI", *rows]) + "\n")
    return path


def hourly(values: list[str], start: float = T0) -> list[str]:
    from datetime import UTC, datetime

    return [f"{datetime.fromtimestamp(start + 3600 * i, UTC).isoformat()},{v}" for i, v in enumerate(values)]


def test_a_site_file_with_every_kind_of_site(tmp_path: Path) -> None:
    csv_file(tmp_path, hourly(["400", "", "100"]))
    (tmp_path / "facility.json").write_bytes(orjson.dumps({**FACILITY, "id": "FACILITY-USA-002", "designPue": 1.3}))
    doc = {
        "sites": {
            "hydro": {
                "wue": 0.3,
                "renewable_share": 0.9,
                "carbon_intensity": 55,
                "nadiki": {
                    "facility": FACILITY,
                    "racks": [{"id": "RACK-FACILITY-USA-001-001", "facility_id": "FACILITY-USA-001"}],
                },
            },
            "mixed": {
                "pue": 1.18,
                "carbon_series": {"file": "carbon.csv", "missing": "interpolate", "outside": "hold", "fallback": 300},
                "location": {"latitude": 37.4, "longitude": -122.1},
                "country_code": "USA",
            },
            "registered": {"nadiki": {"facility_file": "facility.json"}},
        },
        "servers": {
            "default": {"embodied_kg": 1300, "lifetime_years": 4},
            "srv-gpu": {"embodied_kg": 2500, "lifetime_years": 5},
        },
    }
    (tmp_path / "sites.yaml").write_text(yaml.safe_dump(doc))
    catalogue = load_site_file(tmp_path / "sites.yaml")
    hydro, mixed, registered = catalogue.sites["hydro"], catalogue.sites["mixed"], catalogue.sites["registered"]
    # NADIKI fields: designPue -> pue, location, countryCode, id, description; the rest from this file
    assert (hydro.pue, hydro.wue, hydro.renewable_share) == (1.1, 0.3, 0.9)
    assert hydro.location == Location(45.6, -121.2) and hydro.country_code == "USA"
    assert hydro.facility_id == "FACILITY-USA-001" and hydro.rack_ids == ("RACK-FACILITY-USA-001-001",)
    assert hydro.description == "hydro-powered hall"
    assert hydro.carbon == ConstantIntensity(55.0)
    assert catalogue.site_of_rack("RACK-FACILITY-USA-001-001") is hydro
    assert registered.pue == 1.3 and registered.facility_id == "FACILITY-USA-002"
    # the series: the empty hour interpolated, held outside, and a fallback around it
    assert isinstance(mixed.carbon, WithFallback)
    assert isinstance(mixed.carbon.primary, FileIntensity), "read again when the file changes"
    series = mixed.carbon.primary.current_series()
    assert isinstance(series, IntensitySeries) and mixed.carbon.primary.reads == 0, "the check's read is kept"
    assert series.values.tolist() == [400.0, 250.0, 100.0] and series.filled == 1
    assert series.end == T0 + 3 * 3600
    assert mixed.carbon.integral(T0, T0 + 3 * 3600) == pytest.approx((400 + 250 + 100) * 3600)
    assert catalogue.embodied("srv-gpu") == ServerEmbodied(2500, 5)
    assert catalogue.embodied("anything-else") == ServerEmbodied(1300, 4)


def test_a_real_hourly_file_with_empty_hours() -> None:
    series = read_intensity_csv(CISO, missing="interpolate")
    assert len(series.values) == 8760 and series.filled == 3  # three empty hours in CISO 2022
    assert series.period == 365 * 86400
    day = series.integral(T0, T0 + 86400) / 3600  # the sum of the day's 24 hourly values
    k = int((T0 - series.starts[0]) // 3600)
    assert day == pytest.approx(float(np.sum(series.values[k : k + 24])))
    previous = read_intensity_csv(CISO, missing="previous")
    gap = int(np.flatnonzero(series.values != previous.values)[0])
    assert previous.values[gap] == previous.values[gap - 1]


def test_unix_seconds_and_irregular_steps(tmp_path: Path) -> None:
    path = csv_file(tmp_path, ["0,100", "600,300", "3600,50"])
    series = read_intensity_csv(path)
    assert series.end == 6600.0  # the last value holds as long as the step before it
    assert series.integral(0, 3600) == pytest.approx(100 * 600 + 300 * 3000)


# -- malformed series files -------------------------------------------------------------------------

BAD_SERIES: list[Any] = [
    pytest.param(
        ["2022-06-01T00:00:00Z,400", "2022-06-01T01:00:00Z,n/a"],
        "line 3: field 'avg_CI': 'n/a' is not a number",
        id="a value that is not a number",
    ),
    pytest.param(
        ["2022-06-01T00:00:00Z,-4"],
        "line 2: field 'avg_CI': must be a finite number >= 0, got '-4'",
        id="a negative intensity",
    ),
    pytest.param(
        ["2022-06-01T00:00:00Z,400", "yesterday,100"],
        "line 3: field 'timestamp': 'yesterday' is not an ISO 8601 time",
        id="a time that is not a time",
    ),
    pytest.param(
        ["2022-06-01T01:00:00Z,400", "2022-06-01T00:00:00Z,100"],
        "line 3: field 'timestamp': 2022-06-01T00:00:00Z does not follow the previous row's time",
        id="times out of order",
    ),
    pytest.param(
        ["2022-06-01T00:00:00Z,400,7"], "line 2: has 3 fields, the header has 2", id="a row with an extra field"
    ),
    pytest.param([], "no data rows", id="a header only"),
    pytest.param(
        ["2022-06-01T00:00:00Z,", "2022-06-01T01:00:00Z,"],
        "field 'avg_CI': every value is empty",
        id="every value empty",
    ),
]


@pytest.mark.parametrize(("rows", "problem"), BAD_SERIES)
def test_a_malformed_series_names_its_line_and_field(tmp_path: Path, rows: list[str], problem: str) -> None:
    path = csv_file(tmp_path, rows)
    with pytest.raises(SeriesFileError) as err:
        read_intensity_csv(path)
    assert problem in err.value.problems[0]
    assert str(path) in str(err.value)


def test_a_series_without_its_column_and_with_empty_hours_under_missing_error(tmp_path: Path) -> None:
    path = tmp_path / "other.csv"
    path.write_text("timestamp,co2\n2022-06-01T00:00:00Z,1\n")
    with pytest.raises(SeriesFileError, match=r"line 1: column 'avg_CI' is required \(columns: timestamp, co2\)"):
        read_intensity_csv(path)
    gappy = csv_file(tmp_path, hourly(["400", "", "100"]))
    with pytest.raises(SeriesFileError, match="line 3: field 'avg_CI': empty"):
        read_intensity_csv(gappy, missing="error")


# -- malformed site files: every problem with its dotted path -----------------------------------------


def site(**body: Any) -> dict[str, Any]:
    return {"sites": {"north": body}}


BAD_SITES: list[Any] = [
    pytest.param(site(pue=0.9), "sites.north.pue: must be >= 1, got 0.9", id="a PUE below 1"),
    pytest.param(
        site(pue="1.2"), "sites.north.pue: must be a number, got string '1.2'", id="a number given as a string"
    ),
    pytest.param(site(renewable_share=1.5), "sites.north.renewable_share: must be <= 1, got 1.5", id="a share above 1"),
    pytest.param(site(wue=-1), "sites.north.wue: must be >= 0, got -1", id="a negative WUE"),
    pytest.param(site(puee=1.2), "sites.north.puee: unknown field", id="a misspelt field"),
    pytest.param({"site": {}}, "site: unknown field", id="a misspelt section"),
    pytest.param(
        site(carbon_intensity=5, carbon_series={"file": "c.csv"}),
        "sites.north: give one of carbon_intensity, carbon_series or carbon_api (with a fallback), "
        "not carbon_intensity and carbon_series",
        id="two carbon signals",
    ),
    pytest.param(
        site(carbon_series={"column": "avg_CI"}),
        "sites.north.carbon_series.file: is required",
        id="a series without a file",
    ),
    pytest.param(
        site(carbon_series={"file": "c.csv", "missing": "sometimes"}),
        "sites.north.carbon_series.missing: must be one of interpolate, previous, error, got 'sometimes'",
        id="an unknown missing policy",
    ),
    pytest.param(
        site(carbon_series={"file": "c.csv", "outside": "loop"}),
        "sites.north.carbon_series.outside: must be one of error, hold, wrap, got 'loop'",
        id="an unknown outside policy",
    ),
    pytest.param(
        site(carbon_series={"file": "absent.csv"}),
        "sites.north.carbon_series.file: ",
        id="a series file that is not there",
    ),
    pytest.param(
        site(carbon_series={"file": "bad.csv"}),
        "sites.north.carbon_series.file: {tmp}/bad.csv: line 3: field 'avg_CI': 'n/a' is not a number",
        id="a series file with a bad value",
    ),
    pytest.param(
        site(location={"latitude": 95, "longitude": 0}),
        "sites.north.location.latitude: must be <= 90, got 95",
        id="a latitude off the globe",
    ),
    pytest.param(
        site(location={"latitude": 45}),
        "sites.north.location.longitude: is required",
        id="a location without longitude",
    ),
    pytest.param(
        site(pue=1.2, nadiki={"facility": FACILITY}),
        "sites.north.pue: also given by nadiki.facility.designPue; give it once",
        id="PUE given here and by NADIKI",
    ),
    pytest.param(
        site(nadiki={"facility": {k: v for k, v in FACILITY.items() if k != "location"}}),
        "sites.north.nadiki.facility.location: is required",
        id="a NADIKI facility without its required location",
    ),
    pytest.param(
        site(nadiki={"facility": {**FACILITY, "designPue": 0.8}}),
        "sites.north.nadiki.facility.designPue: must be >= 1, got 0.8",
        id="a NADIKI design PUE below 1",
    ),
    pytest.param(
        site(nadiki={"facility": {**FACILITY, "pue": 1.1}}),
        "sites.north.nadiki.facility.pue: unknown field",
        id="a field the NADIKI facility spec does not have",
    ),
    pytest.param(
        site(nadiki={"facility": FACILITY, "racks": [{"id": "RACK-1", "facility_id": "FACILITY-DEU-001"}]}),
        "sites.north.nadiki.racks[0].facility_id: 'FACILITY-DEU-001' is not this site's facility 'FACILITY-USA-001'",
        id="a rack of another facility",
    ),
    pytest.param(
        site(nadiki={"racks": [{"facility_id": "F"}]}),
        "sites.north.nadiki.racks[0].id: is required",
        id="a rack without an id",
    ),
    pytest.param(
        site(country_code="DEU", nadiki={"facility": FACILITY}),
        "sites.north.country_code: 'DEU' but nadiki.facility.countryCode is 'USA'",
        id="two countries",
    ),
    pytest.param(
        {"sites": {"a": {"nadiki": {"facility": FACILITY}}, "b": {"nadiki": {"facility": FACILITY}}}},
        "sites.b.nadiki.facility.id: facility 'FACILITY-USA-001' is already site 'a'",
        id="one NADIKI facility as two sites",
    ),
    pytest.param(
        site(nadiki={"facility_file": "nope.json"}),
        "sites.north.nadiki.facility_file: {tmp}/nope.json: cannot read",
        id="a NADIKI facility file that is not there",
    ),
    pytest.param(
        {"servers": {"srv-1": {"embodied_kg": 1000, "lifetime_years": 0}}},
        "servers.srv-1.lifetime_years: must be > 0, got 0",
        id="a lifetime of zero",
    ),
    pytest.param(
        {"servers": {"srv-1": {"lifetime_years": 4}}},
        "servers.srv-1.embodied_kg: is required",
        id="a server without its embodied emissions",
    ),
    pytest.param(
        {"servers": {"srv-1": {"embodied_kg": 1000, "lifetime_years": 4, "kg": 1}}},
        "servers.srv-1.kg: unknown field",
        id="an unknown server field",
    ),
]


@pytest.mark.parametrize(("doc", "problem"), BAD_SITES)
def test_a_malformed_site_file_is_rejected_with_the_field_named(
    tmp_path: Path, doc: dict[str, Any], problem: str
) -> None:
    csv_file(tmp_path, ["2022-06-01T00:00:00Z,400", "2022-06-01T01:00:00Z,n/a"], "bad.csv")
    with pytest.raises(ConfigError) as err:
        parse_site_document(doc, "sites.yaml", base_dir=tmp_path)
    wanted = problem.replace("{tmp}", str(tmp_path))
    assert any(p.startswith(wanted) for p in err.value.problems), err.value.problems
    assert str(err.value).startswith("sites.yaml: ")


def test_every_problem_is_reported_at_once() -> None:
    doc = {"sites": {"a": {"pue": 0.5, "wue": "lots"}, "b": {"renewable_share": 2}}, "servers": {"x": {}}}
    with pytest.raises(ConfigError) as err:
        parse_site_document(doc, "sites.yaml")
    assert [p.split(":")[0] for p in err.value.problems] == [
        "sites.a.pue",
        "sites.a.wue",
        "sites.b.renewable_share",
        "servers.x.embodied_kg",
        "servers.x.lifetime_years",
    ]


def test_unreadable_and_invalid_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_site_file(tmp_path / "absent.yaml")
    (tmp_path / "broken.yaml").write_text("sites: {north: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: 1 problem\n  line 2, column 1: not valid YAML: "):
        load_site_file(tmp_path / "broken.yaml")


# -- the file-backed carbon source ----------------------------------------------------------------------


def test_the_file_source_rereads_a_changed_file_and_keeps_the_last_good_series(tmp_path: Path) -> None:
    path = tmp_path / "live.csv"
    now = [0.0]
    source = FileIntensity(path, outside="hold", recheck_seconds=60, clock=lambda: now[0])
    with pytest.raises(IntensityUnavailable, match="no series read yet"):
        source.at(T0)  # nothing written yet: the caller's fallback answers
    assert "cannot read" in source.error
    soft = WithFallback(source, ConstantIntensity(300.0))
    assert soft.at(T0) == 300.0

    csv_file(tmp_path, hourly(["400", "100"]), "live.csv")
    source.refresh(force=True)
    assert source.at(T0) == 400.0 and source.reads == 1
    csv_file(tmp_path, hourly(["200", "100"]), "live.csv")
    os.utime(path, (1, 1))  # a new modification time, whatever the file system's resolution
    now[0] = 30.0
    assert source.at(T0) == 400.0  # looked 30 s ago: not yet
    now[0] = 61.0
    assert source.at(T0) == 200.0 and source.reads == 2
    path.write_text("timestamp,avg_CI\n2022-06-01T00:00:00Z,oops\n")
    now[0] = 200.0
    assert source.at(T0) == 200.0  # a bad rewrite keeps the last good series ...
    assert "line 2: field 'avg_CI': 'oops' is not a number" in source.error  # ... and says why
    assert source.integral(T0, T0 + 3600) == pytest.approx(200.0 * 3600)
    path.unlink()
    source.refresh(force=True)
    assert source.at(T0 + 3600) == 100.0 and "cannot read" in source.error


def test_a_site_without_carbon_data_has_an_unknown_intensity_not_zero() -> None:
    # 0 g/kWh would make the site the cleanest of all: every read says it is unknown instead,
    # and what reads it falls back (the agent leaves its gauge out, measure names the problem).
    catalogue = parse_site_document({"sites": {"lab": {"pue": 1.2}, "null": {"carbon_intensity": None}, "zero": {"carbon_intensity": 0}}}, "sites.yaml")
    for name in ("lab", "null"):
        with pytest.raises(IntensityUnavailable, match="no carbon_intensity, carbon_series or carbon_api given"):
            catalogue.sites[name].carbon.at(0.0)
        with pytest.raises(IntensityUnavailable):
            catalogue.sites[name].carbon.integral(0.0, 3600.0)
    assert catalogue.sites["lab"].pue == 1.2
    assert catalogue.sites["zero"].carbon == ConstantIntensity(0.0)  # given as 0: 0


def test_a_facility_file_giving_a_key_twice_names_it_under_the_site(tmp_path: Path) -> None:
    (tmp_path / "facility.yaml").write_text("id: F-1\nid: F-2\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        parse_site_document(site(nadiki={"facility_file": "facility.yaml"}), "sites.yaml", base_dir=tmp_path)
    wanted = (
        f"sites.north.nadiki.facility_file: {tmp_path / 'facility.yaml'}: "
        "id: given twice in one mapping, at line 1 and again at line 2 (a key appears once)"
    )
    assert wanted in err.value.problems, err.value.problems
