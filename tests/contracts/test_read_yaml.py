"""Every document read from disk through contracts.documents.read_yaml: what a bad file gets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from joulesched.contracts.documents import parse_yaml, read_yaml
from joulesched.policy.errors import ConfigError

ROOT = Path(__file__).parents[2]


def test_a_file_that_is_not_utf8_text_is_a_problem_naming_the_file_and_the_byte(tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_bytes(b"a: 1\n\xff\xfe\x00bad\n")
    with pytest.raises(ConfigError) as caught:
        read_yaml(bad)
    assert caught.value.problems == ["not UTF-8 text: byte 0xff at offset 5"]
    assert str(bad) in str(caught.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["extender", "--config", "{bad}"],
        ["agent", "--config", "{bad}"],
        ["deferrer", "--site-file", "{bad}"],
        ["sim", "run", "--trace", str(ROOT / "sim/data/workflows/methylseq-dirt02-001.json"), "--cluster", "{bad}", "--out", "{out}"],
    ],
    ids=["extender config", "agent config", "deferrer site file", "sim cluster"],
)
def test_each_command_refuses_a_file_that_is_not_utf8_with_a_message(tmp_path: Path, argv: list[str]) -> None:
    # each command in a process of its own, as a user runs it (a command's start sets process-wide state)
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\xff\xfe\x00bad")
    args = [a.format(bad=bad, out=tmp_path / "out") for a in argv]
    done = subprocess.run([sys.executable, "-m", "joulesched", *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert f"{bad}: 1 problem" in done.stderr and "not UTF-8 text: byte 0xff at offset 0" in done.stderr
    assert "Traceback" not in done.stderr


# -- a key given twice ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(
            "listen: 0.0.0.0:8888\npolicy:\n  band: 1\n  band: 2\n",
            "policy.band: given twice in one mapping, at line 3 and again at line 4 (a key appears once)",
            id="block style",
        ),
        pytest.param(
            "policy: {band: 1, band: 2}\n",
            "policy.band: given twice in one mapping, at line 1, column 10 and again at line 1, column 19 (a key appears once)",
            id="flow style",
        ),
        pytest.param(
            "nodes:\n  - name: a\n  - name: b\n    cores: 1\n    cores: 2\n",
            "nodes[1].cores: given twice in one mapping, at line 4 and again at line 5 (a key appears once)",
            id="in a list item",
        ),
        pytest.param(
            "listen: a\nprefix: /x\nlisten: b\n",
            "listen: given twice in one mapping, at line 1 and again at line 3 (a key appears once)",
            id="at the top",
        ),
        pytest.param(
            "x:\n  1: a\n  true: b\n",
            "x.true: given twice in one mapping, at line 2 (as 1) and again at line 3 (a key appears once)",
            id="two spellings of one key",
        ),
    ],
)
def test_a_key_given_twice_is_one_problem_naming_its_path_and_lines(tmp_path: Path, text: str, problem: str) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        read_yaml(bad)
    assert caught.value.where == str(bad)
    assert caught.value.problems == [problem]


def test_every_key_given_twice_is_named_in_one_pass_in_document_order(tmp_path: Path) -> None:
    bad = tmp_path / "sites.yaml"
    bad.write_text("sites:\n  a: {pue: 1.1, pue: 1.2}\n  b:\n    wue: 1\n    wue: 2\nsites: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        read_yaml(bad)
    assert [p.split(":")[0] for p in caught.value.problems] == ["sites.a.pue", "sites.b.wue", "sites"]


def test_merge_keys_and_anchors_are_not_duplicates(tmp_path: Path) -> None:
    # a merge brings keys the mapping's own override: YAML's own way to say "this, but", not a mistake
    good = tmp_path / "config.yaml"
    good.write_text("base: &b {band: 0.5, strategy: energy}\npolicy:\n  <<: *b\n  band: 0.3\nother: *b\n", encoding="utf-8")
    assert read_yaml(good) == {
        "base": {"band": 0.5, "strategy": "energy"},
        "policy": {"band": 0.3, "strategy": "energy"},
        "other": {"band": 0.5, "strategy": "energy"},
    }


def test_the_reader_stays_safe(tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("a: !!python/object/apply:os.system ['true']\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        read_yaml(bad)
    (problem,) = caught.value.problems
    assert problem.startswith("line 1, column 4: not valid YAML: could not determine a constructor for the tag")


# -- not YAML: one line, with where ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(
            "listen: 0.0.0.0:8888\npolicy\n  band: 1\n",
            "line 3, column 7: not valid YAML: could not find expected ':' (while scanning a simple key at line 2, column 1)",
            id="a key without its colon",
        ),
        pytest.param(
            "policy:\n  band: [1\n",
            "line 3, column 1: not valid YAML: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence at line 2, column 9)",
            id="an unclosed list",
        ),
        pytest.param("a: 1\n---\nb: 2\n", "line 2, column 1: not valid YAML: expected a single document in the stream at line 1, column 1, but found another document", id="two documents"),
        pytest.param("a: \x00\n", "line 1, column 4: not valid YAML: unacceptable character #x0000: special characters are not allowed", id="a control character"),
        pytest.param("a\tb: 1\n  c: :", "line 1, column 2: not valid YAML: found character '\\t' that cannot start any token (while scanning for the next token)", id="a tab"),
    ],
)
def test_a_file_that_is_not_yaml_is_one_line_naming_line_and_column(tmp_path: Path, text: str, problem: str) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        read_yaml(bad)
    assert caught.value.problems == [problem]
    assert "<unicode string>" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("listen: 0.0.0.0:8888\npolicy:\n  band: 1\n  band: 2\n", "  policy.band: given twice in one mapping, at line 3 and again at line 4 (a key appears once)"),
        ("listen: 0.0.0.0:8888\npolicy\n  band: 1\n", "  line 3, column 7: not valid YAML: could not find expected ':' (while scanning a simple key at line 2, column 1)"),
    ],
    ids=["a key given twice", "not YAML"],
)
def test_the_extender_prints_the_file_and_the_one_problem(tmp_path: Path, text: str, problem: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "joulesched", "extender", "--check", "--config", str(bad)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"joulesched extender: {bad}: 1 problem", problem]


@pytest.mark.parametrize(
    "text",
    [
        # an anchored mapping nested deeper than the `<<: *alias` that merges it, overriding a merged key
        "templates:\n  gpu:\n    node: &gpu\n      <<: {cores: 32, idle_watts: 100}\n      cores: 64\nnodes:\n  - <<: *gpu\n    name: a\n",
        "base: &b {x: 1}\nmid: &m\n  <<: *b\n  x: 2\nleaf:\n  <<: *m\n  x: 3\n",
    ],
    ids=["nested-anchor", "merge-chain"],
)
def test_a_key_overriding_a_merged_one_is_not_given_twice_wherever_the_anchor_is(text: str) -> None:
    assert parse_yaml(text, "t.yaml") == yaml.safe_load(text)
