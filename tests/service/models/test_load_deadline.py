"""A model's load and warm-up have a deadline (``load_timeout_s``): a model whose warm-up never
ends (an ONNX ``Loop`` of 2**62 iterations) is unavailable with that reason, its runs stopped,
while the other models load and serve beside it, the repository API answers, readiness says
what is so and SIGTERM stops the server at once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.settings import Settings
from service.models.threads import in_daemon_thread
from tests.service.conftest import FakeBackend, free_port, wait_gone
from tests.service.models.conftest import put
from tests.service.models.graphs import ENDLESS, model_file
from tests.service.models.test_model_repository import image, index, until
from tests.service.test_server import ROOT


@pytest.fixture
def endless(tmp_path, shipped_model):
    """A repository of ``endless`` (whose warm-up never ends) and ``good`` (the shipped
    model), loaded in that order."""
    root = tmp_path / "models"
    model_file(root / "endless" / "1" / "model.onnx", loop=ENDLESS)
    put(root, "good", 1, shipped_model)
    return root


def test_a_warm_up_past_the_deadline_is_stopped_and_the_others_serve(serve, endless, caplog):
    started = time.monotonic()
    client = serve(endless, wait=False, default_model="good", load_timeout_s=2)
    assert time.monotonic() - started < 30  # settled: the endless model was given up on
    entries = {e["name"]: e for e in client.post("/v2/repository/index").json()}
    assert entries["good"]["state"] == "READY"
    assert entries["endless"]["state"] == "UNAVAILABLE"
    assert entries["endless"]["reason"] == (
        "warming up took longer than the load deadline (2 s, SMSO_LOAD_TIMEOUT_S); its runs "
        "were stopped"
    )
    assert client.get("/readyz").json() == {"status": "ready"}
    refused = client.post("/models/endless/classify", files=image())
    assert refused.status_code == 503
    assert "load deadline" in refused.json()["error"]["message"]
    assert client.post("/classify", files=image()).status_code == 200
    # its warm-up thread ended: terminated, not left spinning
    until(lambda: not [t for t in threading.enumerate() if t.name == "warm up endless"], 10)
    assert "model endless version 1 could not be loaded or warmed up" in caplog.text


def test_a_model_that_never_warms_up_holds_neither_the_others_nor_the_repository_api(
    endless, shipped_model
):
    settings = Settings(
        model_repository=endless,
        default_model="good",
        load_timeout_s=600,
        max_batch_size=1,
        repository_poll_s=0.1,
    )
    with TestClient(create_app(settings)) as client:
        _follows_the_folder_beside_it(client, endless, shipped_model)


def _follows_the_folder_beside_it(client: TestClient, endless: Path, shipped_model: str) -> None:
    until(lambda: index(client).get("good") == ("1", "READY"), 30)  # beside the endless one
    assert index(client)["endless"] == ("1", "LOADING")
    assert client.get("/readyz").json() == {"status": "loading"}  # the first scan's model
    put(endless, "newcomer", 1, shipped_model)  # a new model, while it still loads
    until(lambda: index(client).get("newcomer") == ("1", "READY"), 30)
    put(endless, "good", 2, shipped_model)  # a new version of another model
    until(lambda: index(client).get("good") == ("2", "READY"), 30)
    started = time.monotonic()
    assert client.post("/v2/repository/models/newcomer/load").status_code == 200
    assert time.monotonic() - started < 10
    assert client.post("/models/newcomer/classify", files=image()).status_code == 200
    # the endless model's file is replaced by one that loads: its endless load is cancelled
    model_file(endless / "endless" / "2" / "model.onnx")
    until(lambda: index(client).get("endless") == ("2", "READY"), 30)
    until(lambda: client.get("/readyz").json() == {"status": "ready"}, 10)


def test_the_load_api_answers_within_the_deadline(serve, tmp_path, shipped_model):
    root = tmp_path / "models"
    put(root, "good", 1, shipped_model)
    client = serve(root, model_control="explicit", load_timeout_s=2)
    model_file(root / "endless" / "1" / "model.onnx", loop=ENDLESS)
    started = time.monotonic()
    answer = client.post("/v2/repository/models/endless/load")
    assert time.monotonic() - started < 20
    assert answer.status_code == 400
    assert "load deadline (2 s, SMSO_LOAD_TIMEOUT_S)" in answer.json()["error"]
    assert client.post("/models/good/classify", files=image()).status_code == 200


def test_an_api_load_outlives_the_first_scan_in_explicit_mode(tmp_path):
    """With ``model_control = "explicit"``, a load asked of the repository API while the first
    scan's model still loads ends on its own terms (here its own deadline), not cancelled when
    the first scan's loads end (it answered 503 "changed or was unloaded" and stayed LOADING)."""
    root = tmp_path / "models"
    model_file(root / "first" / "1" / "model.onnx", loop=ENDLESS)
    settings = Settings(model_repository=root, model_control="explicit", load_timeout_s=3)
    with TestClient(create_app(settings)) as client:
        model_file(root / "later" / "1" / "model.onnx", loop=ENDLESS)
        assert index(client)["first"] == ("1", "LOADING")  # the first scan goes on meanwhile
        answer = client.post("/v2/repository/models/later/load")
        assert answer.status_code == 400, answer.json()
        assert "load deadline (3 s, SMSO_LOAD_TIMEOUT_S)" in answer.json()["error"]
        assert index(client)["later"] == ("1", "UNAVAILABLE")


def test_a_result_that_comes_after_the_deadline_is_let_go_of():
    """An onnxruntime session whose constructor returns after its deadline is handed to
    ``abandoned`` (the loader lets go of it), and the thread never held the loop."""
    release = threading.Event()
    let_go: list[str] = []

    async def main() -> None:
        def load() -> str:
            release.wait(30)
            return "session"

        work = in_daemon_thread(load, "load", let_go.append)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await work
        release.set()
        for _ in range(200):
            if let_go:
                return
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert let_go == ["session"]


def test_an_error_in_the_thread_is_the_awaiting_tasks():
    async def main() -> None:
        with pytest.raises(ZeroDivisionError):
            await in_daemon_thread(lambda: 1 // 0, "fails")

    asyncio.run(main())


@pytest.mark.slow
def test_sigterm_stops_the_server_while_a_model_warms_up_for_ever(endless):
    """Started with the default deadline (300 s), the server drains and exits 0 on SIGTERM
    at once, whatever the endless model's warm-up is doing."""
    port = free_port()
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "service.cli", "--model-repository", str(endless)),
            *("--port", str(port), "--grpc-port", "0", "--workers", "1"),
            *("--default-model", "good"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"

    def state() -> dict[str, str]:
        try:
            entries = httpx.post(f"{base}/v2/repository/index", timeout=2).json()
        except httpx.HTTPError:
            return {}
        return {e["name"]: e["state"] for e in entries}

    try:
        until(lambda: state() == {"endless": "LOADING", "good": "READY"}, 60)
        assert httpx.get(f"{base}/readyz").json() == {"status": "loading"}
        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        assert wait_gone(server.pid, 20), "SIGTERM did not stop the server"
        assert server.wait() == 0
        assert time.monotonic() - started < 20
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


class ThreadNames(FakeBackend):
    """Records the thread each run was made on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def run(self, images: Any) -> Any:
        self.threads.append(threading.current_thread().name)
        return super().run(images)


def test_the_warm_up_runs_on_the_thread_that_serves_too(make_client):
    """onnxruntime's CUDA provider keeps its handles and captured CUDA graphs per thread: each
    warm-up batch runs once in a thread of its own (which a deadline may give up on) and once
    on the batcher's inference thread, the one requests then run on."""
    backend = ThreadNames()
    client = make_client(backend, max_batch_size=4)  # buckets 1, 2, 4
    warm_up = backend.threads[:6]
    assert warm_up[:3] == ["warm up " + backend.card.name] * 3, warm_up
    assert all(name.startswith("inference") for name in warm_up[3:]), warm_up
    assert client.post("/classify", files=image()).status_code == 200
    assert backend.threads[6].startswith("inference")
