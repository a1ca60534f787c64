"""The direction of imports (docs/architecture.md): policy/ at the bottom imports only numpy and
the standard library; extender, measurement and sim never import each other's internals upward
into policy, and nothing imports the command dispatcher or the tests."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("policy", "extender", "measurement", "sim", "joulesched", "tests")
# Who may import whom, among the project's own packages.
ALLOWED = {
    "policy": {"policy"},
    "measurement": {"measurement", "policy"},
    "extender": {"extender", "policy", "measurement"},  # measurement.names: the metric names, defined once
    "sim": {"sim", "policy", "measurement", "extender"},  # recordings; the extender for --extender-url auto
}
POLICY_THIRD_PARTY = {"numpy"}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def files_of(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_downward(package: str) -> None:
    wrong = []
    for path in files_of(package):
        for module in imported_modules(path):
            top = module.split(".")[0]
            if top in PROJECT and top not in ALLOWED[package]:
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert wrong == []


def test_policy_uses_only_numpy_and_the_standard_library() -> None:
    wrong = []
    for path in files_of("policy"):
        for module in imported_modules(path):
            top = module.split(".")[0]
            if top not in sys.stdlib_module_names and top not in POLICY_THIRD_PARTY and top != "policy":
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert wrong == []
