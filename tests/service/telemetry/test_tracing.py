"""OpenTelemetry tracing: a request's spans (its own, HTTP or gRPC; the service's decode, and per
batch its images ran in, their queue wait and the inference with the batch size), made with the
SDK's spans or as records through ``SpanPipe`` (the way the service exports them), exported to an
in-memory exporter; and end to end through the exporter process to an OTLP collector."""

from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from service.app import create_app
from service.core.settings import Settings
from service.telemetry.span_export import SpanPipe
from service.telemetry.tracing import check_tracing
from tests.service.conftest import FakeBackend, OtlpCollector, free_port, grey, wait_ready

Collect = Callable[[int], tuple[ReadableSpan, ...]]


@contextlib.contextmanager
def _traced_app(mode: str, settings: Settings) -> Iterator[tuple[TestClient, Collect]]:
    """An app traced with SDK spans or records through a ``SpanPipe`` (``mode``), and
    ``collect(n)``: the spans finished since it started (at least ``n``, waiting for the
    exporter thread when piped)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    pipe = None
    if mode == "sdk":
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        pipe = SpanPipe(provider.resource, exporter, schedule_delay_ms=5)
        provider.add_span_processor(pipe)
    backend = FakeBackend()
    backend.warmups = 3  # buckets 1, 2, 4
    app = create_app(settings, backend, tracer_provider=provider, span_pipe=pipe)

    def collect(n: int) -> tuple[ReadableSpan, ...]:
        deadline = time.monotonic() + 10
        while len(exporter.get_finished_spans()) < n and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05 if pipe is not None else 0)  # nothing more on its way
        return exporter.get_finished_spans()

    with TestClient(app) as client:
        wait_ready(client)
        collect(0)
        exporter.clear()
        yield client, collect


@pytest.fixture(params=["sdk", "piped"])
def traced(request: pytest.FixtureRequest) -> Iterator[tuple[TestClient, Collect]]:
    """A traced app (HTTP only) and ``collect``."""
    with _traced_app(request.param, Settings(max_batch_size=4, max_wait_ms=50)) as traced:
        yield traced


def test_a_request_has_decode_queue_and_inference_spans_under_its_own(traced):
    client, collect = traced
    files = [("file", (f"{i}.png", grey(i), "image/png")) for i in range(2)]
    assert client.post("/classify", files=files).status_code == 200
    spans = collect(4)
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
    client, collect = traced
    files = [("file", (f"{i}.png", grey(i), "image/png")) for i in range(5)]
    assert client.post("/classify", files=files).status_code == 200
    spans = collect(6)
    inference = [s for s in spans if s.name == "inference"]
    assert len(inference) == 2
    assert len([s for s in spans if s.name == "queue"]) == 2
    assert sorted(s.attributes["smso.images"] for s in inference) == [1, 4]
    assert all(s.attributes["smso.images"] <= s.attributes["smso.batch_size"] for s in inference)


def test_the_request_span_follows_the_http_server_conventions(traced):
    """Name ``"{method} {route}"``, kind SERVER, the conventions' attributes; a client's error
    (400) is not the server's: the span's status stays unset."""
    client, collect = traced
    files = [("file", ("0.png", b"not an image", "image/png"))]
    assert client.post("/classify?top_k=2", files=files).status_code == 400
    (request,) = [s for s in collect(1) if s.kind is SpanKind.SERVER]
    assert request.name == "POST /classify"
    attributes = dict(request.attributes)
    assert attributes["http.request.method"] == "POST"
    assert attributes["http.route"] == "/classify"
    assert attributes["url.path"] == "/classify"
    assert attributes["url.query"] == "top_k=2"
    assert attributes["http.response.status_code"] == 400
    assert "error.type" not in attributes
    assert request.status.status_code is StatusCode.UNSET


def test_health_checks_and_scrapes_are_not_traced(traced):
    """Probes and metric scrapes make no spans; the request after them makes its four."""
    client, collect = traced
    client.get("/healthz")
    client.get("/metrics")
    files = [("file", ("0.png", grey(0), "image/png"))]
    assert client.post("/classify", files=files).status_code == 200
    spans = collect(4)
    (request,) = [s for s in spans if s.kind is SpanKind.SERVER]
    assert request.attributes["url.path"] == "/classify"
    assert len(spans) == 4


def test_tracing_is_asked_for_by_the_standard_variables(monkeypatch):
    """An endpoint gives the app a provider whose spans go to an exporter process (started
    with the app); without one, or with the SDK disabled, spans are OpenTelemetry's no-op."""

    def pipe() -> SpanPipe | None:
        return create_app(Settings(), FakeBackend()).state.smso.spans.pipe

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert pipe() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/v1/traces")
    assert isinstance(pipe(), SpanPipe)
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert pipe() is None


def test_another_otlp_protocol_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(ValueError, match="http/protobuf only"):
        check_tracing()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")  # wins
    check_tracing()


def test_spans_reach_an_otlp_collector_through_the_exporter_process(monkeypatch, otlp_collector):
    """End to end, as deployed: the standard variables, the exporter process, OTLP/http. All
    of a request's spans arrive, under one trace, with the resource and their scopes; leaving
    the app flushes them."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_collector)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "smso-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    with TestClient(create_app(Settings(), FakeBackend())) as client:
        wait_ready(client)
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        response = client.post(
            "/classify",
            files=[("file", ("0.png", grey(0), "image/png"))],
            headers={"traceparent": parent},
        )
        assert response.status_code == 200
    spans = {}
    for export in OtlpCollector.requests:
        for resource_spans in export.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            assert attributes["service.name"] == "smso-test"
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    if span.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c":
                        spans[span.name] = (span, scope_spans.scope.name)
    assert {"decode", "queue", "inference"} <= set(spans)
    (request,) = [s for s, _ in spans.values() if s.parent_span_id.hex() == "b7ad6b7169203331"]
    assert request.kind == request.SPAN_KIND_SERVER
    for name in ("decode", "queue", "inference"):
        span, scope = spans[name]
        assert span.parent_span_id == request.span_id
        assert scope == "smso.service"
        assert span.end_time_unix_nano >= span.start_time_unix_nano > 0
    batch = {a.key: a.value.int_value for a in spans["inference"][0].attributes}
    assert batch["smso.batch_size"] == 1


def test_an_endpoint_without_the_sdk_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="install the tracing extra"):
        check_tracing()


@pytest.mark.parametrize("mode", ["sdk", "piped"])
def test_a_grpc_call_has_its_own_span_over_queue_and_inference(mode):
    """A ModelInfer call is a SERVER span (the RPC conventions' attributes) continuing the
    caller's trace from its metadata, with the batch's queue and inference spans under it; a
    client's mistake (NOT_FOUND) is not an error span, and probes are not traced."""
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("tritonclient.grpc")
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    port = free_port()
    settings = Settings(max_batch_size=4, max_wait_ms=50, grpc_port=port)
    with (
        _traced_app(mode, settings) as (client, collect),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        name = client.get("/metadata").json()["model"]["name"]
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.ServerLive(service_pb2.ServerLiveRequest())
        tensor = service_pb2.ModelInferRequest.InferInputTensor(
            name="image", datatype="FP32", shape=[1, 1, 28, 28]
        )
        request = service_pb2.ModelInferRequest(
            model_name=name,
            inputs=[tensor],
            raw_input_contents=[bytes(4 * 28 * 28)],
        )
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        stub.ModelInfer(request, metadata=[("traceparent", parent)])
        with pytest.raises(grpc.RpcError) as missing:
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="nope"))
        assert missing.value.code() is grpc.StatusCode.NOT_FOUND
        spans = collect(5)
    by_name = {span.name: span for span in spans}
    assert set(by_name) == {
        "GET /metadata",
        "inference.GRPCInferenceService/ModelInfer",
        "inference.GRPCInferenceService/ModelMetadata",
        "queue",
        "inference",
    }  # no ServerLive: probes are not traced
    call = by_name["inference.GRPCInferenceService/ModelInfer"]
    assert call.kind is SpanKind.SERVER
    assert call.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert call.parent is not None
    assert call.parent.span_id == 0xB7AD6B7169203331
    assert call.attributes is not None
    assert dict(call.attributes) == {
        "rpc.system": "grpc",
        "rpc.service": "inference.GRPCInferenceService",
        "rpc.method": "ModelInfer",
        "rpc.grpc.status_code": 0,
    }
    for child in ("queue", "inference"):
        child_parent = by_name[child].parent
        assert child_parent is not None
        assert child_parent.span_id == call.context.span_id
    metadata = by_name["inference.GRPCInferenceService/ModelMetadata"]
    assert metadata.attributes is not None
    assert metadata.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert metadata.status.status_code is StatusCode.UNSET
    assert metadata.parent is None
