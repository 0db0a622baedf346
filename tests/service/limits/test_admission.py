"""Admission: settings that fit together, requests that could never be served refused at once
(413, not 503 forever), a model that cannot run is a permanent error, and the work in flight
is bounded."""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError

from service.app import create_app
from service.core.errors import ServiceError
from service.core.settings import Settings
from service.dataplane import pipeline
from service.dataplane.pipeline import run_batched
from service.dataplane.state import ServiceState
from service.http import routes
from service.runtime.outputs import BackendOutputs
from service.runtime.runner import Batch
from tests.service.conftest import FakeBackend, grey
from tests.service.test_server import ROOT


def test_more_files_per_request_than_the_queue_holds_is_refused_at_start_up():
    with pytest.raises(ValidationError, match=r"max_files \(3\) is larger than queue_size \(2\)"):
        Settings(queue_size=2, max_files=3)
    Settings(queue_size=2, max_files=2)  # equal is fine


def test_smso_serve_refuses_the_combination_in_one_line_with_status_2(shipped_model):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "--model-path",
            shipped_model,
            "--queue-size",
            "2",
            "--max-files",
            "3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
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
        # refused before any model is asked
        asyncio.run(run_batched(state, None, images, deadline=0.0, route="/classify"))  # type: ignore[arg-type]
    assert error.value.status == 413
    assert "the queue holds at most 2" in error.value.message


class BrokenBackend(FakeBackend):
    """Loads (it has a card) but every run raises, the warm-up's first."""

    def run(self, images: Batch) -> BackendOutputs:
        raise RuntimeError("Required inputs (['image']) are missing from input feed")


def _renamed_input(tmp_path) -> str:
    """The shipped model with its graph input renamed: it loads, its card still says 'image'."""
    pytest.importorskip("onnx", reason="the test edits the graph with onnx (dev extra)")
    import onnx

    from service.core.settings import DEFAULT_MODEL

    model = onnx.load(DEFAULT_MODEL)
    old = model.graph.input[0].name
    model.graph.input[0].name = "renamed"
    for node in model.graph.node:
        node.input[:] = ["renamed" if name == old else name for name in node.input]
    path = tmp_path / "renamed.onnx"
    onnx.save(model, path)
    return str(path)


def _wait_failed(client: TestClient, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while client.get("/readyz").json()["status"] != "failed":
        assert time.monotonic() < deadline, "the app never reported its model failed"
        time.sleep(0.01)


def _assert_permanent_failure(client: TestClient, reason: str) -> None:
    _wait_failed(client)
    assert "retry-after" not in client.get("/readyz").headers
    files = [("file", ("a.png", grey(1), "image/png"))]
    for route in ("/classify", "/embed"):
        response = client.post(route, files=files)
        assert response.status_code == 503
        assert "retry-after" not in response.headers  # a retry cannot succeed
        error = response.json()["error"]
        assert error["code"] == "model_failed"
        assert " failed to load: " in error["message"]
        assert reason in error["message"]
    assert client.get("/metadata").json()["error"]["code"] == "model_failed"


def test_a_model_that_cannot_run_is_a_permanent_503_not_loading(make_client):
    client = make_client(BrokenBackend(), wait=False)
    _assert_permanent_failure(client, "missing from input feed")


def test_an_onnx_file_with_a_renamed_input_is_a_permanent_503(shipped_model, tmp_path):
    settings = Settings(model_path=_renamed_input(tmp_path), max_batch_size=2)
    with TestClient(create_app(settings)) as client:
        _assert_permanent_failure(client, "renamed")


def test_smso_serve_refuses_a_model_that_cannot_run_before_serving(shipped_model, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "--model-path", _renamed_input(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("smso-serve: error: ")
    # refused at load, where the graph is checked against its card, before any run
    assert "the graph has the inputs ['renamed']; expected one named 'image'" in last
    assert "Traceback" not in proc.stderr
    assert "Uvicorn running" not in proc.stderr


def _hold_slow_files(client: TestClient, hold: Callable[[], None]) -> list[str]:
    """Files named ``slow*`` call ``hold()`` in the decode thread before they are decoded; the
    list returned fills with the names of the files decoded."""
    app = client.app
    assert isinstance(app, FastAPI)  # create_app's
    model = app.state.smso.registry.lookup()
    original = model.preprocess
    decoded: list[str] = []

    def preprocess(data: bytes, filename: str) -> np.ndarray:
        decoded.append(filename)
        if filename.startswith("slow"):
            hold()
        return original(data, filename)

    object.__setattr__(model, "preprocess", preprocess)  # a test's hook into a frozen model
    return decoded


def _slow_decoding(client: TestClient, seconds: float) -> list[str]:
    """Files named ``slow*`` take ``seconds`` to decode (a large PNG on a busy core)."""
    return _hold_slow_files(client, lambda: time.sleep(seconds))


def _post(client: TestClient, name: str) -> tuple[int, Mapping[str, str]]:
    response = client.post("/classify", files=[("file", (name, grey(1), "image/png"))])
    return response.status_code, response.headers


def _decode_starts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float, float, float]]:
    """``(filename, its request's deadline, clock before, clock after)`` around the decode
    thread's call for every image it picks up, decoded or dropped: the call's own deadline
    check lies between the two readings."""
    original = pipeline._decode_unless_abandoned
    taken: list[tuple[str, float, float, float]] = []

    def decode(state, model, upload, deadline, gone):
        before = time.perf_counter()
        try:
            return original(state, model, upload, deadline, gone)
        finally:
            taken.append((upload.filename, deadline, before, time.perf_counter()))

    monkeypatch.setattr(pipeline, "_decode_unless_abandoned", decode)
    return taken


def _request_deadlines(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """Each request's deadline by its first file's name, as the route sets it on arrival."""
    original = routes.decode_all
    deadlines: dict[str, float] = {}

    async def decode_all(state, model, uploads, deadline=None):
        deadlines[uploads[0].filename] = deadline
        return await original(state, model, uploads, deadline)

    monkeypatch.setattr(routes, "decode_all", decode_all)
    return deadlines


def test_expired_requests_stop_decoding_and_do_not_delay_a_later_one(make_client, monkeypatch):
    """Ten slow images in one decode thread would take 5 s; their requests' deadline is 1 s.
    They get 504 at their deadline, an image still waiting for the thread at its request's
    deadline is dropped (not decoded), and a tiny request sent once they have all expired is
    answered (it waited 3.5 s and got 504 before).

    Each request's deadline counts from its own arrival, and on a busy machine the ten arrive
    spread out, so the check is per image: decoded only if the thread took it before its
    request's deadline, dropped only after."""
    client = make_client(request_timeout_s=1.0, decode_threads=1)
    decoded = _slow_decoding(client, 0.5)
    taken = _decode_starts(monkeypatch)
    deadlines = _request_deadlines(monkeypatch)
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        slow = [pool.submit(_post, client, f"slow{i}.png") for i in range(10)]
        limit = time.monotonic() + 30
        while len(deadlines) < 10:  # every slow request has arrived
            assert time.monotonic() < limit, "the slow requests never arrived"
            time.sleep(0.01)
        time.sleep(max(0.0, max(deadlines.values()) - time.perf_counter()) + 0.05)
        status, _ = _post(client, "tiny.png")  # behind at most the image being decoded
        answers = [future.result() for future in slow]
    assert status == 200
    assert "tiny.png" in decoded
    codes = {f"slow{i}.png": code for i, (code, _) in enumerate(answers)}
    assert set(codes.values()) <= {200, 504}
    slow_taken = [row for row in taken if row[0].startswith("slow")]
    assert len(slow_taken) == 10  # each image reached the thread once, decoded or dropped
    for name, deadline, before, after in slow_taken:
        if name in decoded:
            assert before <= deadline, (name, before - deadline)
        else:
            assert after > deadline, (name, after - deadline)
    dropped = [name for name, *_ in slow_taken if name not in decoded]
    assert len(dropped) >= 4, decoded  # 5 s of decoding in one thread cannot fit 1 s deadlines
    assert all(codes[name] == 504 for name in dropped), codes


def _gated_decoding(client: TestClient, release: threading.Event) -> list[str]:
    """Files named ``slow*`` wait in the decode thread until ``release`` is set."""

    def hold() -> None:
        assert release.wait(30), "the test never released the decode thread"

    return _hold_slow_files(client, hold)


def test_images_beyond_max_inflight_are_refused_at_once_with_retry_after(make_client):
    """Two images admitted (one decoding, one waiting for the single thread): every further
    request is refused at once with 503 and Retry-After, never queued for decoding; the two
    are answered once decoding goes on, and every admission is released."""
    client = make_client(max_inflight=2, max_files=2, decode_threads=1)
    release = threading.Event()
    decoded = _gated_decoding(client, release)
    admission = client.app.state.smso.admission
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = [pool.submit(_post, client, f"slow{i}.png") for i in range(2)]
        limit = time.monotonic() + 30
        while admission.in_flight < 2:
            assert time.monotonic() < limit, "the first two requests were never admitted"
            time.sleep(0.01)
        refused = [_post(client, f"more{i}.png") for i in range(4)]
        release.set()
        admitted = [future.result() for future in held]
    assert [status for status, _ in admitted] == [200, 200]
    assert [status for status, _ in refused] == [503] * 4
    assert all(headers["retry-after"] == "1" for _, headers in refused)
    assert sorted(decoded) == ["slow0.png", "slow1.png"]  # the refused never reached a thread
    assert admission.in_flight == 0  # every admission released


def test_max_inflight_defaults_to_the_queue_size_and_must_fit_a_request():
    assert Settings(queue_size=32, max_files=8).inflight_limit == 32
    with pytest.raises(ValidationError, match=r"max_files \(8\) is larger than max_inflight"):
        Settings(max_inflight=4, max_files=8)
