"""Config fields declared once: setting(), read_settings(), limit_problems(), settings_table()."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from joulesched.policy.errors import ConfigError
from joulesched.policy.validate import Checker, limit_problems, read_settings, setting, settings_table


@dataclass(frozen=True)
class Inner:
    count: int = setting(2, "how many", minimum=1, maximum=8)


@dataclass(frozen=True)
class Example:
    name: str = setting(doc="required name", kind="string")
    mode: str = setting("fast", "how", choices=("fast", "slow"))
    ratio: float = setting(0.5, "a share", exclusive_minimum=0, maximum=1)
    on: bool = setting(True, "switch", key="switch.on")
    size: int = setting(20, "lines", kind="integer", minimum=1)
    note: str = setting("", "optional text", empty_ok=True)
    inner: Inner = setting(doc="", factory=Inner)
    items: tuple[str, ...] = setting((), "read by its owner", kind="custom")


def parse(doc: object, limits: bool = True) -> Example:
    check = Checker("x.yaml")
    config = read_settings(Example, doc, check, "ex", limits=limits, items=("a",))
    check.raise_if_any()
    return config


def test_defaults_and_given_custom_fields() -> None:
    config = parse({"name": "n", "switch": {"on": False}, "inner": {"count": 3}, "note": ""})
    assert config == Example(name="n", on=False, inner=Inner(3), items=("a",))
    assert isinstance(config.inner.count, int)


def test_every_problem_at_once_with_dotted_paths() -> None:
    with pytest.raises(ConfigError) as err:
        parse(
            {
                "mode": "medium",
                "ratio": 0,
                "switch": {"on": "yes", "off": 1},
                "size": 2.0,
                "inner": {"count": 2.5},
                "items": [1],
                "colour": "red",
            }
        )
    assert sorted(err.value.problems) == sorted(
        [
            "ex.colour: unknown field (allowed: inner, items, mode, name, note, ratio, size, switch)",
            "ex.name: is required",
            "ex.mode: must be one of fast, slow, got 'medium'",
            "ex.ratio: must be > 0, got 0",
            "ex.switch.off: unknown field (allowed: on)",
            "ex.switch.on: must be true or false, got string 'yes'",
            "ex.size: must be an integer, got 2.0",
            "ex.inner.count: must be a whole number, got 2.5",
        ]
    )


def test_limits_can_be_left_to_the_built_object() -> None:
    config = parse({"name": "n", "mode": "medium", "ratio": 2, "inner": {"count": 0}}, limits=False)
    assert limit_problems(config, "ex") == [
        "ex.mode: must be one of fast, slow, got 'medium'",
        "ex.ratio: must be <= 1, got 2.0",
        "ex.inner.count: must be >= 1, got 0",
    ]


def test_the_reference_table() -> None:
    table = settings_table(Example)
    assert "| `name` | — (required) | text | required name |" in table
    assert "| `switch.on` | true | true, false | switch |" in table
    assert "| `ratio` | 0.5 | > 0, <= 1 | a share |" in table
    assert "| `inner.count` | 2 | whole, 1 … 8 | how many |" in table
    assert "| `mode` | `fast` | `fast`, `slow` | how |" in table


def test_an_integer_too_large_for_a_float_is_a_problem_at_its_path_not_an_overflow() -> None:
    # YAML reads any run of digits as an integer; float() of 401 digits raises OverflowError.
    import yaml

    from joulesched.policy.config import parse_policy
    from joulesched.policy.errors import ConfigError
    from joulesched.policy.profile import parse_profiles

    big = "1" + "0" * 400
    check = Checker("policy.yaml")
    parse_policy(yaml.safe_load(f"band: {big}\n"), check)
    assert check.problems == ["policy.band: must be finite, got 1000000000000000000000000000000000000000"]
    doc = yaml.safe_load(f"nodes: [{{name: a, cores: 4, power_curve_watts: [{big},1,1,1,1,1,1,1,1,1,1]}}]\n")
    with pytest.raises(ConfigError) as caught:
        parse_profiles(doc, "nodes.yaml")
    assert caught.value.problems[0] == (
        "nodes[0].power_curve_watts[0]: must be a finite number, got 1000000000000000000000000000000000000000"
    )
