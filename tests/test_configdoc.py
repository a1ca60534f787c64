"""The config reference tables in docs/ are generated from the fields' declarations."""

from __future__ import annotations

from pathlib import Path

import pytest

from joulesched import configdoc


def test_the_config_tables_in_docs_are_up_to_date() -> None:
    assert configdoc.main(["--check"]) == 0, "config tables in docs/ are stale: run python -m joulesched.configdoc"


def test_check_fails_on_a_stale_table_and_a_rewrite_fixes_it(tmp_path: Path) -> None:
    for file in {file for file, *_ in configdoc.TABLES}:
        (tmp_path / file).write_text((configdoc.DOCS / file).read_text())
    path = tmp_path / "configuration.md"
    path.write_text(path.read_text().replace("| `listen` |", "| `listen_` |"))
    assert configdoc.main(["--check", "--docs", str(tmp_path)]) == 1
    assert configdoc.main(["--docs", str(tmp_path)]) == 0
    assert configdoc.main(["--check", "--docs", str(tmp_path)]) == 0


def test_a_document_without_markers_is_an_error(tmp_path: Path) -> None:
    for file in {file for file, *_ in configdoc.TABLES}:
        (tmp_path / file).write_text("# nothing\n")
    with pytest.raises(SystemExit, match="no markers"):
        configdoc.main(["--check", "--docs", str(tmp_path)])
