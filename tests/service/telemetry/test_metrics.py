"""Metrics of several worker processes (prometheus_client's multiprocess mode), each worker a
real process here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from service.telemetry.metrics import MULTIPROC_ENV, Metrics, exposition

ROOT = Path(__file__).resolve().parents[3]

#: A worker: reports a queue depth and one image, then waits for its stdin to close.
WORKER = """
import sys
from service.telemetry.metrics import Metrics
metrics = Metrics()
metrics.queue_depth.set(int(sys.argv[1]))
metrics.images.labels("/classify", "m", "1").inc()
metrics.images.labels("/classify", "m", "2").inc()
print("ready", flush=True)
sys.stdin.read()
"""


def worker(folder: Path, depth: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(depth)],
        cwd=ROOT,
        text=True,
        env=os.environ | {MULTIPROC_ENV: str(folder)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n"
    return process


def test_the_queue_depth_is_summed_over_live_workers_only(tmp_path, monkeypatch):
    """uvicorn replaces a worker that dies; the queue depth it last reported must not count
    for ever, while the images it answered still do."""
    live, dead = worker(tmp_path, 2), worker(tmp_path, 7)
    try:
        dead.communicate("")  # exits
        monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
        text = exposition(None).decode()
    finally:
        live.communicate("")
    assert "smso_queue_depth 2.0" in text
    assert 'smso_images_total{model="m",route="/classify",version="1"} 2.0' in text


def test_forget_removes_every_series_of_a_version_and_only_its():
    metrics = Metrics()
    for version in ("1", "2"):
        metrics.images.labels("/classify", "m", version).inc()
        metrics.inference_stage.labels("m", version, "run").observe(0.01)
        metrics.batch_observer("m", version)
        metrics.drift_reporter("m", version)(0.5, 10, False)
    metrics.forget("m", "1")
    text = exposition(metrics).decode()
    assert 'version="1"' not in text
    assert 'smso_images_total{model="m",route="/classify",version="2"} 1.0' in text
    assert 'smso_inference_stage_seconds_count{model="m",stage="run",version="2"} 1.0' in text


def test_with_several_workers_a_retired_versions_series_are_left_out_of_the_page(
    tmp_path, monkeypatch
):
    """prometheus_client cannot remove a series from the workers' files: the page shows the
    versions the answering worker has loaded and not retired, and leaves out the others: one
    it retired, and one that it never loaded (retired elsewhere before it started). A version
    served again is shown again; what names no model is always shown."""
    live = worker(tmp_path, 1)
    try:
        monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
        metrics = Metrics()
        for version in ("1", "2"):
            metrics.batch_observer("m", version)  # loaded by this worker too
        metrics.forget("m", "1")
        text = exposition(metrics).decode()
        assert 'version="1"' not in text
        assert 'smso_images_total{model="m",route="/classify",version="2"} 1.0' in text
        assert "smso_queue_depth 1.0" in text  # no model label
        metrics.batch_observer("m", "1")  # loaded again
        assert 'version="1"' in exposition(metrics).decode()
        assert 'version="2"' not in exposition(Metrics()).decode()  # a worker that never did
    finally:
        live.communicate("")
