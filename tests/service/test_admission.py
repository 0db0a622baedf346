"""Admission: settings that fit together, requests that could never be served refused at once
(413, not 503 forever), a model that cannot run is a permanent error, and the work in flight
is bounded."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np
import pytest
from pydantic import ValidationError

from service.errors import ServiceError
from service.pipeline import ServiceState, run_batched
from service.settings import Settings

from .test_server import ROOT


def test_more_files_per_request_than_the_queue_holds_is_refused_at_start_up():
    with pytest.raises(ValidationError, match=r"max_files \(3\) is larger than queue_size \(2\)"):
        Settings(queue_size=2, max_files=3)
    Settings(queue_size=2, max_files=2)  # equal is fine


def test_smso_serve_refuses_the_combination_in_one_line_with_status_2(shipped_model):
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "--model-path", shipped_model,
         "--queue-size", "2", "--max-files", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("smso-serve: error:")
    assert "max_files (3) is larger than queue_size (2)" in proc.stderr


def test_more_images_than_the_queue_can_ever_hold_is_413_with_the_reason():
    """A guard behind the settings' check: whatever route hands the pipeline too many images
    gets a final 413, not a 503 that no retry can get past."""
    state = ServiceState(Settings(queue_size=2, max_files=2))
    images = [np.zeros((1, 28, 28), np.float32)] * 3
    with pytest.raises(ServiceError) as error:
        asyncio.run(run_batched(state, images, deadline=0.0, route="/classify"))
    assert error.value.status == 413
    assert "the queue holds at most 2" in error.value.message
