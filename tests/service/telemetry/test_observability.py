"""Logs, request ids and the access line; /embed's base64 encoding."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from service.runtime.outputs import BackendOutputs
from service.runtime.runner import Batch
from service.telemetry.logs import JsonFormatter, RequestIdFilter, TextFormatter
from tests.service.conftest import FakeBackend, grey
from tests.service.test_server import real_server


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """What the service logs while the test runs, one JSON object per line (as smso-serve with
    SMSO_LOG_FORMAT=json writes it)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def parsed(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def access(stream: io.StringIO) -> list[dict]:
    return [line for line in parsed(stream) if line["logger"] == "service.access"]


def test_a_request_id_is_generated_echoed_and_on_the_access_line(make_client, lines):
    client = make_client()
    files = [("file", (f"{i}.png", grey(40 * i), "image/png")) for i in range(3)]
    response = client.post("/models/fake-small_cnn-smso/classify", files=files)
    assert response.status_code == 200
    rid = response.headers["x-request-id"]
    assert len(rid) == 32
    assert int(rid, 16) >= 0
    (line,) = [a for a in access(lines) if a.get("request_id") == rid]
    assert line["route"] == "/models/{model_name}/classify"  # the template, not the path
    assert line["method"] == "POST"
    assert line["status"] == 200
    assert line["images"] == 3
    assert line["model"] == "fake-small_cnn-smso"
    assert line["version"]
    assert line["level"] == "INFO"
    assert line["message"] == f"POST {line['route']} 200"
    assert line["time"].endswith("Z")
    assert "T" in line["time"]
    for field in ("latency_ms", "decode_ms", "queue_ms", "inference_ms"):
        assert line[field] >= 0
    assert line["latency_ms"] >= line["decode_ms"] + line["queue_ms"] + line["inference_ms"]


class _HeldBackend(FakeBackend):
    """Batches after warm-up wait for ``release`` (a batch still running at the deadline,
    however long decoding took on a busy machine)."""

    def __init__(self) -> None:
        super().__init__()
        self.started, self.release = threading.Event(), threading.Event()

    def run(self, images: Batch) -> BackendOutputs:
        if self.calls >= self.warmups:
            self.started.set()
            self.release.wait(30)
        return super().run(images)


def test_a_request_past_its_deadline_still_has_its_split(make_client, lines):
    """A 504 whose batch was still running at the deadline: its inference time runs to the
    deadline, not missing from the line."""
    backend = _HeldBackend()
    client = make_client(backend, request_timeout_s=2.0)
    files = [("file", ("a.png", grey(1), "image/png"))]
    try:
        response = client.post("/classify", files=files, headers={"X-Request-ID": "late-1"})
    finally:
        backend.release.set()
    assert response.status_code == 504
    assert backend.started.is_set()  # its batch had started
    (line,) = [a for a in access(lines) if a.get("request_id") == "late-1"]
    assert line["queue_ms"] >= 0
    assert line["inference_ms"] > 0
    assert line["decode_ms"] + line["queue_ms"] + line["inference_ms"] <= line["latency_ms"]


def test_a_clients_id_is_kept_and_a_bad_one_replaced(make_client, lines):
    client = make_client()
    kept = client.get("/metadata", headers={"X-Request-ID": "trace 42/abc"})
    assert kept.headers["x-request-id"] == "trace 42/abc"
    for bad in ("x" * 129, "caf\u00e9", "  ", "a\tb"):
        raw = bad.encode("utf-8")
        response = client.get("/metadata", headers=[(b"x-request-id", raw)])
        assert response.status_code == 200
        assert len(response.headers["x-request-id"]) == 32  # a new one, no failure
    assert next(a["request_id"] for a in access(lines)) == "trace 42/abc"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/nowhere", 404), ("POST", "/classify?top_k=0", 422), ("GET", "/healthz", 200)],
)
def test_every_response_has_an_id(make_client, method, path, status):
    client = make_client()
    response = client.request(
        method,
        path,
        files=[("file", ("a.png", grey(1), "image/png"))] if method == "POST" else None,
    )
    assert response.status_code == status
    assert len(response.headers["x-request-id"]) == 32


def test_a_request_over_the_size_limit_has_an_id(make_client, lines):
    client = make_client(max_request_bytes=1024, max_upload_bytes=1024)
    files = [("file", ("big.png", os.urandom(4096), "image/png"))]
    response = client.post("/classify", files=files, headers={"X-Request-ID": "big-one"})
    assert response.status_code == 413
    assert response.headers["x-request-id"] == "big-one"
    (line,) = [a for a in access(lines) if a.get("request_id") == "big-one"]
    assert line["status"] == 413
    assert line["route"] == "/classify"


def test_a_line_logged_inside_a_request_carries_its_id(make_client, lines):
    client = make_client(FakeBackend(fail=True))
    files = [("file", ("a.png", grey(1), "image/png"))]
    response = client.post("/embed", files=files, headers={"X-Request-ID": "failing-1"})
    assert response.status_code == 500
    assert response.headers["x-request-id"] == "failing-1"
    failed = [line for line in parsed(lines) if "inference failed" in line["message"]]
    assert failed
    assert all(line["request_id"] == "failing-1" for line in failed)
    (line,) = [a for a in access(lines) if a.get("request_id") == "failing-1"]
    assert line["status"] == 500
    assert line["inference_ms"] >= 0  # the failed batch's time is still on the line


def test_an_unexpected_error_is_one_json_line_with_its_id(make_client, lines, monkeypatch):
    client = make_client()

    def broken(*args, **kwargs):
        raise ZeroDivisionError("nobody expected this")

    monkeypatch.setattr("service.http.routes.top_classes", broken)
    with pytest.raises(ZeroDivisionError):  # TestClient re-raises what the app raised
        client.post(
            "/classify",
            files=[("file", ("a.png", grey(1), "image/png"))],
            headers={"X-Request-ID": "oops"},
        )
    (error,) = [line for line in parsed(lines) if "exception" in line]
    assert error["request_id"] == "oops"
    assert "ZeroDivisionError" in error["exception"]
    (line,) = [a for a in access(lines) if a.get("request_id") == "oops"]
    assert line["status"] == 500


def test_outside_a_request_a_line_has_no_id():
    record = logging.LogRecord("service", logging.WARNING, __file__, 1, "hello %s", ("you",), None)
    RequestIdFilter().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "hello you"
    assert "request_id" not in line
    assert line["level"] == "WARNING"
    assert line["logger"] == "service"


def test_the_text_access_line_is_one_readable_line():
    record = logging.LogRecord(
        "service.access", logging.INFO, __file__, 1, "%s %s %s", ("POST", "/classify", "200"), None
    )
    record.request_id = "abc"
    record.access = {
        "method": "POST",
        "route": "/classify",
        "status": 200,
        "images": 2,
        "latency_ms": 3.5,
    }
    text = TextFormatter().format(record)
    assert "\n" not in text
    assert text.endswith(
        'service.access POST /classify 200 images=2 latency_ms=3.5 request_id="abc"'
    )


def test_an_exception_is_a_field_not_lines():
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        record = logging.LogRecord(
            "service", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    text = JsonFormatter().format(record)
    assert "\n" not in text
    assert "ValueError: bad\nthing" in json.loads(text)["exception"]


@pytest.mark.parametrize("prefix", ["", "/models/fake-small_cnn-smso"])
@pytest.mark.parametrize("normalize", [False, True])
def test_base64_embeddings_decode_to_the_json_ones(make_client, prefix, normalize):
    client = make_client()
    files = [("file", (f"{i}.png", grey(30 + 50 * i), "image/png")) for i in range(3)]

    def embed(**params) -> list:
        response = client.post(
            f"{prefix}/embed", files=files, params={"normalize": normalize, **params}
        )
        assert response.status_code == 200, response.text
        return [r["embedding"] for r in response.json()["results"]]

    listed = np.asarray(embed())
    as32 = [np.frombuffer(base64.b64decode(e), "<f4") for e in embed(encoding="base64")]
    as16 = [
        np.frombuffer(base64.b64decode(e), "<f2") for e in embed(encoding="base64", dtype="float16")
    ]
    np.testing.assert_allclose(np.stack(as32), listed, rtol=1e-7)
    np.testing.assert_allclose(np.stack(as16), listed, rtol=1e-3, atol=1e-6)  # float16: 11 bits
    if normalize:  # normalised before encoding
        np.testing.assert_allclose(np.linalg.norm(np.stack(as32), axis=1), 1, rtol=1e-6)
    rounded = np.asarray(embed(dtype="float16"))  # in JSON: the values rounded to float16
    np.testing.assert_array_equal(rounded, np.stack(as16).astype(np.float64))


def test_the_openapi_documents_the_encodings(make_client):
    schema = make_client().get("/openapi.json").json()
    params = {p["name"]: p for p in schema["paths"]["/embed"]["post"]["parameters"]}
    assert params["encoding"]["schema"]["enum"] == ["json", "base64"]
    assert params["dtype"]["schema"]["enum"] == ["float32", "float16"]
    result = schema["components"]["schemas"]["EmbedResult"]["properties"]["embedding"]
    assert {"type": "string"} in result["anyOf"]
    assert "base64" in result["description"]


@pytest.mark.slow
def test_a_real_server_logs_only_json_lines(shipped_model):
    env = os.environ | {"SMSO_LOG_FORMAT": "json"}
    with real_server(shipped_model, "--log-level", "info", env=env) as (base, server):
        files = [("file", ("a.png", grey(100), "image/png"))]
        response = httpx.post(f"{base}/classify", files=files, headers={"X-Request-ID": "real"})
        assert response.status_code == 200
        assert response.headers["x-request-id"] == "real"
        assert httpx.get(f"{base}/nowhere").status_code == 404
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        assert server.stdout is not None  # stdout=PIPE
        output = server.stdout.read()
    lines = [json.loads(line) for line in output.splitlines()]  # every line is JSON
    loggers = {line["logger"] for line in lines}
    assert {"service", "service.access", "uvicorn.error"} <= loggers
    (line,) = [a for a in lines if a.get("request_id") == "real"]
    assert line["route"] == "/classify"
    assert line["status"] == 200
    assert line["images"] == 1
    assert line["model"]
    assert line["version"]
    assert line["decode_ms"] >= 0
    assert any(a.get("route") == "unmatched" and a["status"] == 404 for a in lines)
