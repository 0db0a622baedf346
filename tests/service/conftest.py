"""Fixtures for service tests: a fake backend (fast, slow or failing), clients, test images.

Nothing here imports torch or training: tests/service runs in the serving environment
(``pip install -e '.[serving-cpu,serving-test]'``) as well as in the development one.
"""

from __future__ import annotations

import gzip
import http.server
import io
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from service.app import create_app
from service.core.card import CARD_KEY, ModelCard, parse_card
from service.core.settings import DEFAULT_MODEL, Settings
from service.runtime.outputs import BackendOutputs
from service.runtime.runner import Batch, buckets, stacked
from service.telemetry import stage_clock

#: Debian's Fashion-MNIST idx files (``make data`` installs them): real images for the tests.
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
CLASSES = [f"class{k}" for k in range(10)]
CARD: dict[str, Any] = {
    "format": "smso-model-card",
    "version": 1,
    "classes": CLASSES,
    "input": {"name": "image", "channels": 1, "height": 28, "width": 28, "dynamic_size": True},
    "preprocessing": {"colour": "L", "resize": 28, "crop": 28, "mean": [0.5], "std": [0.25]},
    "model": {"backbone": "small_cnn", "head": "smso", "embedding_dim": 4},
    "dataset": "fake",
    "checkpoint": {"sha256": "0123456789abcdef"},
}


class FakeBackend:
    """logits_k = k * mean(image); embedding = (mean, std, min, max). Optionally slow or failing;
    records every batch size it runs."""

    def __init__(self, delay_s: float = 0.0, fail: bool = False):
        import json

        self.card, self.card_dict = parse_card({CARD_KEY: json.dumps(CARD)})
        self.providers = ["FakeExecutionProvider"]
        self.delay_s, self.fail = delay_s, fail
        self.batches: list[int] = []
        self.calls = 0
        self.lock = threading.Lock()

    def run(self, images: Batch) -> BackendOutputs:
        with self.lock:
            self.calls += 1
            warming = self.calls <= self.warmups
        if not warming:
            time.sleep(self.delay_s)
            self.batches.append(len(images))
            if self.fail:
                raise RuntimeError("the accelerator fell over")
        start = time.perf_counter()
        flat = stacked(images).reshape(len(images), -1)
        stage_clock.record("stack", start)  # as a runner does
        mean = flat.mean(1, keepdims=True)
        logits = mean * np.arange(10, dtype=np.float32)
        embedding = np.concatenate(
            [
                mean,
                flat.std(1, keepdims=True),
                flat.min(1, keepdims=True),
                flat.max(1, keepdims=True),
            ],
            axis=1,
        )
        return BackendOutputs(
            logits=logits.astype(np.float32), embedding=embedding.astype(np.float32)
        )

    warmups = 0  # calls that are warm-up (set by make_client: one per batch-size bucket)


def read_idx(path: Path) -> np.ndarray:
    """An idx file of bytes (gzip-compressed where the name ends in ``.gz``) as a uint8 array:
    the header is two zero bytes, the type ``0x08``, the number of dimensions d and d big-endian
    uint32 sizes, then the values in C order (``(N, 28, 28)`` images, ``(N,)`` labels)."""
    raw = path.read_bytes()
    raw = gzip.decompress(raw) if path.suffix == ".gz" else raw
    if raw[:3] != b"\0\0\x08":
        raise ValueError(f"{path} is not an idx file of bytes")
    ndim = raw[3]
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def png(array: np.ndarray, fmt: str = "PNG", **save: Any) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt, **save)
    return buf.getvalue()


def grey(value: int, size: tuple[int, int] = (28, 28)) -> bytes:
    return png(np.full(size, value, np.uint8))


def wait_ready(client: TestClient, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while client.get("/readyz").status_code != 200:
        if time.monotonic() > deadline:
            raise TimeoutError("the app did not become ready")
        time.sleep(0.01)


def process_running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (an exited child nobody has reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Whether ``pid`` has exited (or is a zombie) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while process_running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http_ready(
    base: str, alive: Callable[[], str | None] = lambda: None, timeout_s: float = 120
) -> None:
    """Until a real server at ``base`` answers 200 on /readyz; ``alive()`` returns why the
    server is gone (its output), or None while it runs."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not become ready"
        gone = alive()
        assert gone is None, f"the server exited: {gone}"
        time.sleep(0.05)


def warm_up_calls(max_batch_size: int) -> int:
    """How many runs a model's warm-up makes: each batch-size bucket twice, once in a thread of
    its own (with the load deadline) and once on the batcher's inference thread
    (``service.models.loader``)."""
    return 2 * len(buckets(max_batch_size))


class HeldWarmUp(FakeBackend):
    """Warm-up batches wait for ``release``: the server is still warming up, however slow the
    machine, until the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def run(self, images: Batch) -> BackendOutputs:
        if self.calls < self.warmups:
            self.release.wait(30)
        return super().run(images)


@pytest.fixture
def make_client() -> Iterator[Callable[..., TestClient]]:
    """``make_client(backend=None, **settings)``: a ready TestClient (closed after the test)."""
    clients: list[TestClient] = []

    def make(backend: Any = None, wait: bool = True, **settings: Any) -> TestClient:
        settings.setdefault("max_batch_size", 4)
        backend = backend if backend is not None else FakeBackend()
        if isinstance(backend, FakeBackend):
            backend.warmups = warm_up_calls(settings["max_batch_size"])
        client = TestClient(create_app(Settings(**settings), backend))
        client.__enter__()
        clients.append(client)
        if wait:
            wait_ready(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture(scope="session")
def shipped_model() -> str:
    if not DEFAULT_MODEL.is_file():
        pytest.fail(f"{DEFAULT_MODEL} is missing: the repository ships it (make onnx)")
    return str(DEFAULT_MODEL)


__all__ = [
    "CARD",
    "CLASSES",
    "FASHION_MNIST",
    "FakeBackend",
    "HeldWarmUp",
    "ModelCard",
    "free_port",
    "grey",
    "png",
    "read_idx",
    "wait_http_ready",
    "wait_ready",
    "warm_up_calls",
]


class OtlpCollector(http.server.BaseHTTPRequestHandler):
    """An OTLP/http endpoint keeping every export request it gets (gzip bodies decompressed)."""

    requests: ClassVar[list[Any]] = []  # ExportTraceServiceRequest messages

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        type(self).requests.append(ExportTraceServiceRequest.FromString(body))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def otlp_collector() -> Iterator[str]:
    """An :class:`OtlpCollector` on a free loopback port, its requests emptied: its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OtlpCollector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    OtlpCollector.requests = []
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
