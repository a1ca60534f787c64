"""One root exception per part: every exception class a part defines derives from its root."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from joulesched.contracts.errors import ContractError
from joulesched.extender.errors import ExtenderError
from joulesched.impact.errors import ImpactError
from joulesched.measurement.errors import MeasurementError
from joulesched.policy.errors import PolicyError

ROOTS: dict[str, type[Exception]] = {
    "joulesched.policy": PolicyError,
    "joulesched.contracts": ContractError,
    "joulesched.measurement": MeasurementError,
    "joulesched.extender": ExtenderError,
    "joulesched.impact": ImpactError,
}
# Modules that need an optional dependency or a running service at import time.
SKIP = {"joulesched.extender.gunicorn_conf"}


def modules_of(package: str) -> list[str]:
    root = importlib.import_module(package)
    return [package] + [m.name for m in pkgutil.walk_packages(root.__path__, package + ".") if m.name not in SKIP]


@pytest.mark.parametrize("package", sorted(ROOTS))
def test_every_exception_of_a_part_derives_from_its_root(package: str) -> None:
    outside = []
    for name in modules_of(package):
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and issubclass(cls, BaseException) and not issubclass(cls, ROOTS[package]):
                outside.append(f"{name}.{cls.__qualname__}")
    assert not outside, f"outside {ROOTS[package].__name__}: {', '.join(outside)}"


@pytest.mark.parametrize("package", sorted(ROOTS))
def test_the_root_is_named_in_the_package_docstring(package: str) -> None:
    doc = importlib.import_module(package).__doc__ or ""
    assert "Error hierarchy" in doc and ROOTS[package].__name__ in doc


def test_callers_that_catch_builtins_still_catch_them() -> None:
    from joulesched.extender.errors import WireError
    from joulesched.measurement.errors import TooManyWindows, UnknownWindow

    assert issubclass(WireError, ValueError)
    assert issubclass(UnknownWindow, KeyError)
    assert issubclass(TooManyWindows, OverflowError)
