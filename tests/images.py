"""The two images built from this checkout's Containerfile with ``hack/build-image.sh --offline``
(no image pulled: a Debian base made with mmdebstrap), once per test session.

Used by tests/deploy/test_image.py and the chain test (tests/e2e/test_chain_e2e.py). Without
podman, runc or mmdebstrap the tests skip, except under CI, where they fail.
"""

from __future__ import annotations

import subprocess
import time
from functools import cache
from pathlib import Path

from tests.support import require

ROOT = Path(__file__).resolve().parents[1]
# podman run on these machines: runc (crun 1.8 refuses the hybrid cgroup layout) and explicit
# limits within the hard ones.
RUN = ["--runtime", "runc", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


def require_podman() -> None:
    for binary in ("podman", "runc", "mmdebstrap"):
        require(binary, "hack/test.sh installs podman, runc and mmdebstrap")


@cache
def built_images() -> tuple[dict[str, str], float]:
    """``({"extender": name, "agent": name}, seconds the build took)``."""
    require_podman()
    started = time.monotonic()
    done = subprocess.run(
        [str(ROOT / "hack" / "build-image.sh"), "--offline"], cwd=ROOT, capture_output=True, text=True, timeout=1200
    )
    if done.returncode != 0:
        raise AssertionError(f"hack/build-image.sh --offline failed:\n{done.stderr[-4000:]}")
    names = done.stdout.split()[-2:]
    if len(names) != 2:
        raise AssertionError(f"hack/build-image.sh printed no image names: {done.stdout!r}")
    return {"extender": names[0], "agent": names[1]}, time.monotonic() - started


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


def image_size_mb(image: str) -> float:
    done = podman("image", "inspect", "--format", "{{.Size}}", image)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip()) / 1e6


__all__ = ["RUN", "built_images", "image_size_mb", "podman", "require_podman"]
