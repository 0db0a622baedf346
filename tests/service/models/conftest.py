"""The model repository's fixtures: a folder of models in Triton's layout, and servers on it."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.settings import Settings
from tests.service.conftest import wait_ready


def put(repository: Path, name: str, version: int, model: str | Path) -> Path:
    """Copy ``model`` to ``repository/name/version/model.onnx``."""
    folder = repository / name / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model, folder / "model.onnx.tmp")
    (folder / "model.onnx.tmp").rename(folder / "model.onnx")  # appears whole
    return folder


@pytest.fixture
def repository(tmp_path: Path, shipped_model: str) -> Path:
    root = tmp_path / "models"
    put(root, "boots", 1, shipped_model)
    put(root, "shirts", 1, shipped_model)
    put(root, "shirts", 2, shipped_model)
    return root


@pytest.fixture
def serve() -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def start(repository: Path, wait: bool = True, **settings: Any) -> TestClient:
        """A server on ``repository``, ready unless ``wait`` is False (then its first scan
        is done: ``/readyz`` no longer says "loading")."""
        settings = {"max_batch_size": 4, "repository_poll_s": 0.1, **settings}
        client = TestClient(create_app(Settings(model_repository=repository, **settings)))
        client.__enter__()
        clients.append(client)
        if wait:
            wait_ready(client)
        else:
            deadline = time.monotonic() + 60
            while client.get("/readyz").json()["status"] == "loading":
                assert time.monotonic() < deadline, "the first scan did not end"
                time.sleep(0.01)
        return client

    yield start
    for client in clients:
        client.__exit__(None, None, None)
