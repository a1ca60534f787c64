"""``joulesched agent --record``: a recording file that cannot be opened is refused by name, exit 2,
before the agent serves (no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from joulesched.contracts.net import free_port


def agent(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    for root in ("sys", "proc", "cg", "dev"):
        (tmp_path / root).mkdir(exist_ok=True)
    roots = [f"--sysfs-root={tmp_path / 'sys'}", f"--procfs-root={tmp_path / 'proc'}"]
    roots += [f"--cgroup-root={tmp_path / 'cg'}", f"--dev-root={tmp_path / 'dev'}"]
    cmd = [sys.executable, "-m", "joulesched", "agent", *roots, "--node-name=n1", f"--listen=127.0.0.1:{free_port()}"]
    return subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=60)


def test_a_record_file_in_a_missing_folder_is_refused_before_serving(tmp_path: Path) -> None:
    record = tmp_path / "nonexist" / "rec.jsonl"
    done = agent(tmp_path, "--record", str(record))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "serving" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"joulesched agent: record.file: cannot open {record}: No such file or directory"


def test_a_record_file_that_is_a_folder_is_refused(tmp_path: Path) -> None:
    done = agent(tmp_path, "--record", str(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip().splitlines()[-1] == f"joulesched agent: record.file: cannot open {tmp_path}: Is a directory"
    )
