"""The house of docs/architecture.md: one import name, and imports that point only downward.

Every part is a subpackage of ``joulesched`` (its folder stays at the top of the repository and
is reached through a link in ``joulesched/``). ``policy`` at the bottom imports only numpy and
the standard library; ``contracts`` (metric names, file formats, units) sits on it; the agent,
the extender, the reports and the simulator build on those two and never on each other; nothing
imports the command dispatcher (``joulesched.cli``) or the tests.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("policy", "contracts", "measurement", "extender", "impact", "sim")
# Who may import whom, among the parts.
ALLOWED = {
    "policy": {"policy"},
    "contracts": {"contracts", "policy"},
    "measurement": {"measurement", "contracts", "policy"},
    "extender": {"extender", "contracts", "policy"},
    "impact": {"impact", "contracts", "policy"},
    "sim": {"sim", "contracts", "policy"},  # the extender runs as a process (sim/extender.py), never imported
}
POLICY_THIRD_PARTY = {"numpy"}
# Names the project once installed at the top level; nothing may import them any more.
RETIRED_TOP_LEVEL = set(PARTS) | {"deploy"}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def files_of(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def part_of(module: str) -> str | None:
    """The part a ``joulesched.<part>...`` module belongs to; ``"cli"`` for the dispatcher."""
    words = module.split(".")
    if words[0] != "joulesched" or len(words) < 2:
        return None
    return words[1]


def test_every_part_is_linked_into_the_one_package() -> None:
    for part in PARTS:
        link = ROOT / "joulesched" / part
        assert link.is_symlink() and link.resolve() == ROOT / part, f"joulesched/{part} must link to ../{part}"
        assert (ROOT / part / "__init__.py").is_file(), f"{part}/ has no __init__.py"


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_parts_import_only_downward(part: str) -> None:
    wrong = []
    for path in files_of(part):
        for module in imported_modules(path):
            target = part_of(module)
            if target is not None and target not in ALLOWED[part]:
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
            if module.split(".")[0] == "tests":
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert wrong == []


@pytest.mark.parametrize("folder", [*PARTS, "joulesched", "tests", "bench"])
def test_nothing_imports_a_retired_top_level_name(folder: str) -> None:
    wrong = []
    for path in files_of(folder):
        for module in imported_modules(path):
            if module.split(".")[0] in RETIRED_TOP_LEVEL:
                wrong.append(f"{path.relative_to(ROOT)} imports {module} (now joulesched.{module})")
    assert wrong == []


def test_policy_uses_only_numpy_and_the_standard_library() -> None:
    wrong = []
    for path in files_of("policy"):
        for module in imported_modules(path):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in POLICY_THIRD_PARTY or part_of(module) == "policy":
                continue
            wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert wrong == []
