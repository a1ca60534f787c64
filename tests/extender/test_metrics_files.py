"""/metrics under gunicorn: the workers' multiprocess files, read while a worker boots."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

# prometheus-client chooses its multiprocess value class when first imported, so the
# workers here are processes of their own, as under gunicorn.
WORKER = """
from joulesched.extender.metrics import ExtenderMetrics
m = ExtenderMetrics()
m.connections.inc(3)
m.requests.labels(verb="filter", code="200").inc()
"""
SCRAPE = """
import sys
from joulesched.extender.metrics import ExtenderMetrics
sys.stdout.buffer.write(ExtenderMetrics().exposition())
"""


def _run(code: str, metrics_dir: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)


def _samples(text: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_scrape_while_a_worker_creates_its_files_reports_the_others(tmp_path: Path) -> None:
    assert _run(WORKER, tmp_path).returncode == 0
    # A booting worker's file, created and not yet sized (prometheus-client's MmapedDict
    # opens it, then truncates it to its first size): prometheus-client's own collector
    # fails the whole scrape on it.
    (tmp_path / "counter_4242.db").touch()
    (tmp_path / "gauge_livesum_4242.db").touch()
    scrape = _run(SCRAPE, tmp_path)
    assert scrape.returncode == 0, scrape.stderr.decode()[-2000:]
    samples = _samples(scrape.stdout.decode())
    assert samples["joulesched_extender_connections_total"] == 3
    assert samples["joulesched_extender_requests_total"] == 1


def test_a_file_that_is_not_empty_and_unreadable_still_fails_the_scrape(tmp_path: Path) -> None:
    assert _run(WORKER, tmp_path).returncode == 0
    (tmp_path / "counter_4242.db").write_bytes(b"\x40\x00")  # shorter than its own header
    scrape = _run(SCRAPE, tmp_path)
    assert scrape.returncode != 0
    assert b"struct.error" in scrape.stderr
