"""OpenTelemetry tracing: a request's spans (FastAPI's request span; the service's decode, and
per batch its images ran in, their queue wait and the inference with the batch size) exported to
an in-memory exporter."""

from __future__ import annotations

import importlib.util

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.app import create_app
from service.settings import Settings
from service.tracing import check_tracing, telemetry_config

from .conftest import FakeBackend, grey, wait_ready


@pytest.fixture
def traced() -> tuple[TestClient, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    backend = FakeBackend()
    backend.warmups = 3  # buckets 1, 2, 4
    app = create_app(Settings(max_batch_size=4, max_wait_ms=50), backend, tracer_provider=provider)
    with TestClient(app) as client:
        wait_ready(client)
        exporter.clear()
        yield client, exporter


def test_a_request_has_decode_queue_and_inference_spans_under_its_own(traced):
    client, exporter = traced
    files = [("file", (f"{i}.png", grey(i), "image/png")) for i in range(2)]
    assert client.post("/classify", files=files).status_code == 200
    spans = exporter.get_finished_spans()
    names = sorted(span.name for span in spans)
    assert names.count("decode") == 1
    assert names.count("queue") == 1  # per request and batch, not per image
    assert names.count("inference") == 1
    (request,) = [s for s in spans if s.parent is None]
    assert "/classify" in request.name
    by_id = {span.context.span_id: span for span in spans}

    def root(span):
        while span.parent is not None:
            span = by_id[span.parent.span_id]
        return span

    assert {root(span).context.span_id for span in spans} == {request.context.span_id}
    inference = [s for s in spans if s.name == "inference"]
    assert {s.attributes["smso.batch_size"] for s in inference} == {2}  # one batch of two
    assert {s.attributes["smso.images"] for s in inference} == {2}  # both the request's
    assert {s.attributes["smso.model"] for s in inference} == {"fake-small_cnn-smso"}
    assert next(s for s in spans if s.name == "decode").attributes["smso.images"] == 2
    for queue in (s for s in spans if s.name == "queue"):
        assert queue.end_time >= queue.start_time


def test_a_request_split_over_batches_has_queue_and_inference_spans_for_each(traced):
    """Five images with batches of at most four: two batches, so two queue and two inference
    spans, their images adding up to the request's."""
    client, exporter = traced
    files = [("file", (f"{i}.png", grey(i), "image/png")) for i in range(5)]
    assert client.post("/classify", files=files).status_code == 200
    spans = exporter.get_finished_spans()
    inference = [s for s in spans if s.name == "inference"]
    assert len(inference) == 2
    assert len([s for s in spans if s.name == "queue"]) == 2
    assert sorted(s.attributes["smso.images"] for s in inference) == [1, 4]
    assert all(s.attributes["smso.images"] <= s.attributes["smso.batch_size"] for s in inference)


def test_health_checks_are_not_traced_by_the_service(traced):
    client, exporter = traced
    client.get("/healthz")
    assert not [s for s in exporter.get_finished_spans() if s.name in ("decode", "queue")]


def test_tracing_is_asked_for_by_the_standard_variables(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert telemetry_config()["auto_configure"] is False
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert telemetry_config()["auto_configure"] is True
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert telemetry_config()["auto_configure"] is False


def test_an_endpoint_without_the_sdk_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="install the tracing extra"):
        check_tracing()
