"""OpenTelemetry tracing: a request's spans (its own, HTTP or gRPC; the service's decode, and per
batch its images ran in, their queue wait and the inference with the batch size), made by the
service's own provider (``otlp_provider``: the SDK's batch processor, to an in-memory exporter
here) and, end to end, over OTLP/http to a collector; the sampler (parent-based, one new trace in
1,000 by default); the spans not exported, counted."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import http.server
import importlib.util
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import TextMapPropagator, default_getter
from opentelemetry.trace import SpanKind, StatusCode

pytest.importorskip("opentelemetry.sdk", reason="the OpenTelemetry SDK: the tracing extra")
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.app import create_app
from service.core.settings import Settings
from service.telemetry.span_batches import CountedBatchSpanProcessor
from service.telemetry.tracing import (
    DEFAULT_SAMPLING_RATIO,
    Spans,
    check_tracing,
    otlp_provider,
    sampling_ratio,
)
from tests.service.conftest import (
    FakeBackend,
    OtlpCollector,
    free_port,
    grey,
    wait_ready,
    warm_up_calls,
)

Collect = Callable[[int], tuple[ReadableSpan, ...]]
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # a caller's sampled span
PARENT_TRACE, PARENT_SPAN = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the variables it means; none comes from the environment it runs in."""
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
        "OTEL_BSP_MAX_QUEUE_SIZE",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        "OTEL_BSP_SCHEDULE_DELAY",
    ):
        monkeypatch.delenv(name, raising=False)


@contextlib.contextmanager
def _traced_app(settings: Settings) -> Iterator[tuple[TestClient, Collect]]:
    """An app traced by the service's provider (every request sampled) to an in-memory
    exporter, and ``collect(n)``: the spans ended since it started (waiting for ``n``: the
    batch's spans end on the inference thread, maybe after the response)."""
    exporter = InMemorySpanExporter()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_TRACES_SAMPLER_ARG", "1")
        provider = otlp_provider(exporter=exporter)
    backend = FakeBackend()
    backend.warmups = warm_up_calls(4)  # buckets 1, 2, 4, twice
    app = create_app(settings, backend, tracer_provider=provider)

    def collect(n: int) -> tuple[ReadableSpan, ...]:
        for _ in range(1000):
            provider.force_flush()
            if len(exporter.get_finished_spans()) >= n:
                break
            time.sleep(0.01)
        return exporter.get_finished_spans()

    try:
        with TestClient(app) as client:
            wait_ready(client)
            collect(0)
            exporter.clear()
            yield client, collect
    finally:
        provider.shutdown()


@pytest.fixture
def traced() -> Iterator[tuple[TestClient, Collect]]:
    """A traced app (HTTP only) and ``collect``."""
    with _traced_app(Settings(max_batch_size=4, max_wait_ms=50)) as traced:
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
    for span in spans:
        assert span.end_time >= span.start_time
        assert span.instrumentation_scope.name == "smso.service"


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
    """An endpoint gives the app the SDK's provider (shut down with the app); without one, or
    with the SDK disabled, spans are OpenTelemetry's no-op."""

    def enabled() -> bool:
        app = create_app(Settings(), FakeBackend())
        with TestClient(app):
            return app.state.smso.spans.enabled

    assert not enabled()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    assert enabled()
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not enabled()


def test_another_otlp_protocol_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(ValueError, match="http/protobuf only"):
        check_tracing()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")  # wins
    check_tracing()


def test_an_endpoint_without_the_sdk_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="install the tracing extra"):
        check_tracing()


@pytest.mark.parametrize("arg", ["2", "-0.1", "nan", "one in ten"])
def test_a_sampling_ratio_that_is_not_one_is_a_one_line_error(monkeypatch, arg):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    with pytest.raises(ValueError, match="a number from 0 to 1"):
        check_tracing()
    # the SDK reads it then, and would take a bad one as 1.0: every request traced
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    with pytest.raises(ValueError, match="a number from 0 to 1"):
        check_tracing()


def test_a_sampler_the_sdk_does_not_know_is_a_one_line_error(monkeypatch):
    """The SDK would fall back to parentbased_always_on: every request traced."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratioo")
    with pytest.raises(ValueError, match="'traceidratioo' is not a sampler: one of always_off"):
        check_tracing()


def test_a_clients_long_path_is_cut_in_the_span(monkeypatch):
    """A caller may force a trace and send 64 KiB paths: 2,048 pending spans must not hold them
    whole."""
    from service.telemetry.tracing import MAX_ATTRIBUTE_LENGTH

    monkeypatch.delenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", raising=False)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1")
    exporter = InMemorySpanExporter()
    provider = otlp_provider(exporter=exporter)
    with provider.get_tracer("t").start_as_current_span("s") as span:
        span.set_attribute("url.path", "/" + "p" * 65_536)
    provider.shutdown()
    (finished,) = exporter.get_finished_spans()
    assert finished.attributes is not None
    path = finished.attributes["url.path"]
    assert isinstance(path, str)
    assert len(path) == MAX_ATTRIBUTE_LENGTH


# --- the sampler -------------------------------------------------------------------------------


def _sampled(provider: Any, trace_id: int, parent: str | None = None) -> bool:
    """Whether ``provider``'s sampler samples a new SERVER span of ``trace_id``, child of the
    caller's ``traceparent`` ``parent`` when given."""
    caller = propagate.extract({"traceparent": parent} if parent else {})
    result = provider.sampler.should_sample(caller, trace_id, "GET /x", SpanKind.SERVER)
    return result.decision.is_sampled()


#: the ratio sampler samples a trace whose id's low 64 bits are below ratio x 2^64: the first
#: at any ratio above 0, the second at none below 1
LOW, HIGH = 1, (1 << 64) - 1


def test_by_default_one_new_trace_in_1000_is_sampled_and_a_callers_choice_is_followed():
    """Triton's default rate (1000): ParentBased(TraceIdRatioBased(0.001)); a caller's sampled
    trace is followed whatever its id, its unsampled one is not."""
    assert DEFAULT_SAMPLING_RATIO == 0.001
    provider = otlp_provider(exporter=InMemorySpanExporter())
    try:
        description = provider.sampler.get_description()
        assert description.startswith("ParentBased{root:TraceIdRatioBased{0.001}")
        assert _sampled(provider, LOW)
        assert not _sampled(provider, HIGH)
        assert _sampled(provider, (1 << 64) // 2000)  # within one in 1,000
        assert not _sampled(provider, (1 << 64) // 500)  # beyond it
        assert _sampled(provider, HIGH, PARENT)  # the caller sampled it
        assert not _sampled(provider, LOW, PARENT[:-2] + "00")  # the caller did not
    finally:
        provider.shutdown()


def test_the_standard_variables_set_the_ratio_or_choose_the_sampler(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    assert sampling_ratio() == 0.25
    provider = otlp_provider(exporter=InMemorySpanExporter())
    assert "TraceIdRatioBased{0.25}" in provider.sampler.get_description()
    provider.shutdown()
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")  # wins, as the SDK reads it
    assert sampling_ratio() is None
    provider = otlp_provider(exporter=InMemorySpanExporter())
    assert provider.sampler.get_description() == "AlwaysOnSampler"
    assert _sampled(provider, HIGH, PARENT[:-2] + "00")
    provider.shutdown()


def test_ratio_0_traces_no_new_request_but_follows_a_callers_sampled_trace(monkeypatch):
    exporter = InMemorySpanExporter()
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    provider = otlp_provider(exporter=exporter)
    app = create_app(Settings(), FakeBackend(), tracer_provider=provider)
    files = [("file", ("0.png", grey(0), "image/png"))]
    with TestClient(app) as client:
        wait_ready(client)
        for _ in range(20):
            assert client.post("/classify", files=files).status_code == 200
        provider.force_flush()
        assert exporter.get_finished_spans() == ()
        response = client.post("/classify", files=files, headers={"traceparent": PARENT})
        assert response.status_code == 200
    provider.shutdown()  # exports what is left
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == ["POST /classify", "decode", "inference", "queue"]
    assert {s.context.trace_id for s in spans} == {PARENT_TRACE}


# --- end to end: OTLP/http --------------------------------------------------------------------


def test_spans_reach_an_otlp_collector_with_a_callers_sampled_trace(monkeypatch, otlp_collector):
    """As deployed: the standard variables, the default sampler, OTLP/http. A caller's sampled
    trace is followed: all of its request's spans arrive under it, with the resource and their
    scope; leaving the app exports them."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_collector)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "smso-test")
    with TestClient(create_app(Settings(), FakeBackend())) as client:
        wait_ready(client)
        response = client.post(
            "/classify",
            files=[("file", ("0.png", grey(0), "image/png"))],
            headers={"traceparent": PARENT},
        )
        assert response.status_code == 200
    spans = {}
    for export in OtlpCollector.requests:
        for resource_spans in export.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            assert attributes["service.name"] == "smso-test"
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    if span.trace_id.hex() == f"{PARENT_TRACE:032x}":
                        spans[span.name] = (span, scope_spans.scope.name)
    assert set(spans) == {"POST /classify", "decode", "queue", "inference"}
    request, _ = spans["POST /classify"]
    assert request.parent_span_id.hex() == f"{PARENT_SPAN:016x}"
    assert request.kind == request.SPAN_KIND_SERVER
    for name in ("decode", "queue", "inference"):
        span, scope = spans[name]
        assert span.parent_span_id == request.span_id
        assert scope == "smso.service"
        assert span.end_time_unix_nano >= span.start_time_unix_nano > 0
    batch = {a.key: a.value.int_value for a in spans["inference"][0].attributes}
    assert batch["smso.batch_size"] == 1


class _Refusing(http.server.BaseHTTPRequestHandler):
    """An OTLP/http endpoint that refuses every export (400: not retried)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(400)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_spans_a_collector_refuses_are_counted_in_the_metrics(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1")
    app = create_app(Settings(), FakeBackend())
    try:
        with TestClient(app) as client:
            wait_ready(client)
            files = [("file", ("0.png", grey(0), "image/png"))]
            assert client.post("/classify", files=files).status_code == 200
    finally:
        server.shutdown()
        server.server_close()
    registry = app.state.smso.metrics.registry
    assert registry.get_sample_value("smso_spans_dropped_total") == 4  # the request's four


# --- the processor's counts -------------------------------------------------------------------


class _Held(InMemorySpanExporter):
    """An exporter whose exports wait until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(30)
        return super().export(spans)


class _Failing(SpanExporter):
    def __init__(self, raises: bool) -> None:
        self.raises = raises

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.raises:
            raise ConnectionError("the collector went away")
        return SpanExportResult.FAILURE


def _ended(processor: CountedBatchSpanProcessor, spans: int, sampled: bool = True) -> None:
    """End ``spans`` spans of a tracer whose spans go to ``processor``."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    provider = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF, shutdown_on_exit=False)
    provider.add_span_processor(processor)
    for i in range(spans):
        provider.get_tracer("test").start_span(f"span {i}").end()


def test_a_full_queue_drops_and_counts_new_spans_and_never_waits():
    """Two spans may be pending (queued, or in an export under way): of five ended while the
    first export is held, three are dropped and counted; the two are exported."""
    exporter, told = _Held(), list[int]()
    processor = CountedBatchSpanProcessor(
        exporter, told.append, max_queue_size=2, max_export_batch_size=1
    )
    _ended(processor, 5)
    assert told == [1, 1, 1]
    assert processor.dropped == 3
    exporter.release.set()
    processor.shutdown()
    assert [s.name for s in exporter.get_finished_spans()] == ["span 0", "span 1"]
    _ended(processor, 1)  # after shutdown: dropped and counted
    assert processor.dropped == 4


@pytest.mark.parametrize("raises", [False, True], ids=["fails", "raises"])
def test_a_failed_export_counts_its_spans(raises):
    told: list[int] = []
    processor = CountedBatchSpanProcessor(_Failing(raises), told.append)
    _ended(processor, 3)
    _ended(processor, 2, sampled=False)  # never sampled: neither exported nor counted
    processor.force_flush()
    assert sum(told) == 3
    processor.shutdown()
    assert processor.dropped == 3


def test_the_queue_sizes_come_from_the_standard_variables(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "7")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512")  # more than the queue: cut to it
    processor = CountedBatchSpanProcessor(InMemorySpanExporter())
    assert processor.max_queue_size == 7
    processor.shutdown()
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "many")  # the default, warned
    processor = CountedBatchSpanProcessor(InMemorySpanExporter())
    assert processor.max_queue_size == 2048
    processor.shutdown()


# --- the service's spans, one by one ----------------------------------------------------------


@pytest.fixture
def service_spans(monkeypatch: pytest.MonkeyPatch):
    """The service's ``Spans`` on its provider (every new trace sampled) and an in-memory
    exporter, the provider, and ``finish()``: the spans exported."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1")
    exporter = InMemorySpanExporter()
    provider = otlp_provider(exporter=exporter)
    spans = Spans(provider.get_tracer("smso.service"))

    def finish() -> tuple[ReadableSpan, ...]:
        provider.force_flush()
        return exporter.get_finished_spans()

    yield spans, provider, finish
    provider.shutdown()


def test_the_service_spans_mark_an_error_and_skip_unsampled_parents(service_spans):
    spans, provider, finish = service_spans
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        with pytest.raises(KeyError), spans.timed("decode", {"smso.images": 1}):
            raise KeyError("x")
        spans.finished("queue", request.get_span_context(), 10, 20)
    unsampled = trace.SpanContext(1, 2, False, trace.TraceFlags(0))
    spans.finished("queue", unsampled, 10, 20)
    with spans.timed("decode"):  # no request span: no decode span either
        pass
    by_name = {s.name: s for s in finish()}
    assert set(by_name) == {"request", "decode", "queue"}
    decode = by_name["decode"]
    assert decode.status.status_code is StatusCode.ERROR
    assert [e.name for e in decode.events] == ["exception"]
    assert decode.parent.span_id == by_name["request"].context.span_id
    assert (by_name["queue"].start_time, by_name["queue"].end_time) == (10, 20)
    assert by_name["queue"].instrumentation_scope.name == "smso.service"


def test_a_server_error_or_an_exception_marks_the_request_span(service_spans):
    spans, _, finish = service_spans
    scope = {"type": "http", "method": "GET", "path": "/x", "headers": [], "server": ("h", 80)}
    spans.end_request(spans.start_request(scope), scope, "/x", 503)
    spans.end_request(spans.start_request(scope), scope, None, 500, RuntimeError("boom"))
    spans.end_request(spans.start_request(scope), scope, "/x", 499, asyncio.CancelledError())
    assert trace.get_current_span() is trace.INVALID_SPAN  # each request's context was left
    unavailable, crashed, left = finish()
    assert left.status.status_code is StatusCode.UNSET  # the client left: not an error
    assert left.attributes["http.response.status_code"] == 499
    assert unavailable.name == "GET /x"
    assert unavailable.status.status_code is StatusCode.ERROR
    assert unavailable.attributes["error.type"] == "503"
    assert crashed.name == "GET"  # no route matched
    assert crashed.attributes["error.type"] == "RuntimeError"
    assert crashed.status.description == "RuntimeError: boom"
    assert [e.name for e in crashed.events] == ["exception"]
    assert unavailable.kind is SpanKind.SERVER
    assert unavailable.parent is None


def test_the_request_span_continues_the_callers_trace_from_its_headers(service_spans):
    """``traceparent`` and ``tracestate`` (a repeated header joined, RFC 9110) make the request
    span the caller's child in its trace; without them it is a root of a new trace."""
    spans, _, finish = service_spans
    headers = [(b"traceparent", PARENT.encode()), (b"tracestate", b"a=1"), (b"tracestate", b"b=2")]
    headers += [(b"host", b"x"), (b"user-agent", b"t")]
    for request_headers in (headers, headers[3:]):
        scope = {"type": "http", "method": "GET", "path": "/x", "headers": request_headers}
        spans.end_request(spans.start_request(scope), scope, "/x", 200)
    child, root = finish()
    assert child.context.trace_id == PARENT_TRACE
    assert child.parent.span_id == PARENT_SPAN
    assert child.parent.is_remote
    assert list(child.context.trace_state.items()) == [("a", "1"), ("b", "2")]
    assert root.parent is None
    assert root.context.trace_id != child.context.trace_id


class _HeaderPropagator(TextMapPropagator):
    """A propagator that reads a header its ``fields`` does not list (as B3 reads ``x-b3-*``
    when configured as ``b3``): it must be handed every header."""

    def extract(self, carrier, context=None, getter=default_getter):
        value = getter.get(carrier, "x-trace")
        if not value:
            return context or Context()
        remote = trace.SpanContext(int(value[0]), 3, True, trace.TraceFlags(1))
        return trace.set_span_in_context(trace.NonRecordingSpan(remote), context)

    def inject(self, carrier, context=None, setter=None):
        pass

    @property
    def fields(self):
        return set()


@pytest.fixture
def header_propagator() -> Iterator[None]:
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(_HeaderPropagator())
    yield
    propagate.set_global_textmap(previous)


@pytest.mark.usefixtures("header_propagator")
def test_another_propagator_is_handed_every_header(service_spans):
    spans, _, finish = service_spans
    scope = {"type": "http", "method": "GET", "path": "/x", "headers": [(b"x-trace", b"9")]}
    spans.end_request(spans.start_request(scope), scope, "/x", 200)
    (span,) = finish()
    assert span.context.trace_id == 9
    assert span.parent.span_id == 3


# --- gRPC ---------------------------------------------------------------------------------------


def test_a_grpc_call_has_its_own_span_over_queue_and_inference():
    """A ModelInfer call is a SERVER span (the RPC conventions' attributes) continuing the
    caller's trace from its metadata, with the batch's queue and inference spans under it; a
    client's mistake (NOT_FOUND) is not an error span, and probes are not traced."""
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("tritonclient.grpc")
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    port = free_port()
    settings = Settings(max_batch_size=4, max_wait_ms=50, grpc_port=port)
    with (
        _traced_app(settings) as (client, collect),
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
        stub.ModelInfer(request, metadata=[("traceparent", PARENT)])
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
    assert call.context.trace_id == PARENT_TRACE
    assert call.parent is not None
    assert call.parent.span_id == PARENT_SPAN
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


# --- the SDK's public API only --------------------------------------------------------------


def _opentelemetry_names(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Each part of every OpenTelemetry module or name ``tree`` imports, with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules, names = [node.module], [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            modules, names = [alias.name for alias in node.names], []
        else:
            continue
        for module in modules:
            if module.split(".")[0] == "opentelemetry":
                for part in [*module.split("."), *names]:
                    yield node.lineno, part


def test_the_service_uses_no_private_opentelemetry_names():
    """Every OpenTelemetry module and name the service imports is public (no leading ``_``):
    an SDK upgrade may change its private parts without notice."""
    private = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for path in sorted((ROOT / "service").rglob("*.py"))
        for line, name in _opentelemetry_names(ast.parse(path.read_text()))
        if name.startswith("_")
    ]
    assert private == []
