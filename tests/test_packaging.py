"""The distribution owns one import name: the wheel installs ``joulesched`` alone, and PyPI's
``measurement`` (a unit library that once overwrote our agent package) installs beside it
without touching it.

This builds the wheel from the checkout and installs it in a fresh virtual environment with its
dependencies from the package index, as a user's ``pip install`` does.
"""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPI_MEASUREMENT = "measurement==3.2.2"  # "Easily use and manipulate unit-aware measurements in Python"


def run(*argv: str | Path, timeout: float = 600, cwd: Path | None = None) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert done.returncode == 0, f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, ROOT)
    (built,) = out.glob("joulesched-*.whl")
    return built


def test_the_wheel_has_one_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"joulesched", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    parts = {name.split("/")[1] for name in names if name.startswith("joulesched/") and name.count("/") >= 2}
    assert {"policy", "contracts", "measurement", "extender", "impact", "sim"} <= parts
    top_level = next(n for n in names if n.endswith("top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["joulesched"]


@pytest.mark.slow
def test_pypi_measurement_installs_beside_joulesched(wheel: Path, tmp_path: Path) -> None:
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    away = tmp_path  # not the checkout, whose folders would shadow site-packages for `python -c`
    run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel)
    run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", PYPI_MEASUREMENT)
    both = run(
        python,
        "-c",
        "import measurement, joulesched.measurement.agent as agent; "
        "print(measurement.__file__); print(agent.__file__)",
        cwd=away,
    ).split()
    assert "/site-packages/measurement/" in both[0] and "/site-packages/joulesched/measurement/" in both[1]
    demo = run(env / "bin" / "joulesched", "extender", "--demo", timeout=120, cwd=away)
    assert 'prioritize answered' in demo and '"Score":' in demo, demo
    # Uninstalling the other distribution leaves ours whole.
    run(python, "-m", "pip", "uninstall", "-q", "-y", "measurement")
    run(python, "-c", "import joulesched.measurement.agent, joulesched.extender.app", cwd=away)
