"""Every document read from disk through contracts.documents.read_yaml: what a bad file gets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from joulesched.contracts.documents import read_yaml
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
