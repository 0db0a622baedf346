"""``SpanEncoder`` writes, byte for byte, the OTLP request the SDK's encoder writes for the same
spans; the exporter process sends it through the OTLP/http exporter's own client."""

from __future__ import annotations

import pickle
from types import SimpleNamespace
from typing import Any, cast

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Link, SpanContext, TraceFlags
from opentelemetry.util.types import AnyValue

from service.telemetry.span_encoding import SpanEncoder
from service.telemetry.span_export import _consume, _encoded_sender, from_record, to_record
from tests.service.conftest import OtlpCollector
from tests.service.telemetry.test_span_export import _sdk_span

SERVICE = ("smso.service", None, None)


def _records() -> tuple[list[tuple[Any, ...]], Resource]:
    """An SDK span's record (remote parent, trace state, link, event, error status, a scope with
    a version and schema) and the service's kinds: a root, its children, odd attribute values,
    and scopes interleaved."""
    span, resource = _sdk_span()
    sdk = to_record(span)
    # records: their 13 fields, then scope, events and links (added below for some)
    root: tuple[Any, ...]
    child: tuple[Any, ...]
    empty: tuple[Any, ...]
    root = ("POST /classify", 5, 6, 0, False, 1, (), 1, 10, 20, {"http.route": "/x"}, 0, None)
    root += (SERVICE, (), ())
    odd = {
        "none": None,
        "bytes": b"\x00\x01",
        "nested": ((1, 2), ("a",)),
        "mapping": {"k": 1.5, "m": {"deep": True}},
        "bad": object(),  # left out, by both
        "bad-inside": (1, object()),
        "beyond-int64": 2**64,
        "lone-surrogate": "\udc80",
        7: "a key that is not a string",
        "float": 0.25,
        "big": 2**62,
    }
    child = ("decode", 5, 7, 6, False, 1, (), 0, 11, 12, odd, 2, "ValueError: x")
    child += (SERVICE, (("exception", 12, {"exception.type": "ValueError"}),), ())
    # no description without an error; "remote" means nothing without a parent
    empty = ("queue", 5, 8, 6, False, 1, (), 0, 12, 13, {}, 0, "unset", SERVICE, (), ())
    root = (*root[:4], True, *root[5:])
    return [root, sdk, child, empty, (*sdk[:2], 99, *sdk[3:])], resource


def test_the_encoder_writes_what_the_sdk_encoder_writes():
    records, resource = _records()
    scopes: dict[tuple[Any, ...], Any] = {}
    spans = [from_record(record, resource, scopes) for record in records]
    expected = encode_spans(spans).SerializeToString()
    assert SpanEncoder(resource)(records) == expected
    request = ExportTraceServiceRequest.FromString(expected)
    (resource_spans,) = request.resource_spans
    assert [len(s.spans) for s in resource_spans.scope_spans] == [3, 2]  # grouped by scope


def test_the_otlp_exporter_is_sent_encoded_requests_and_others_get_sdk_spans():
    exporter = OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
    assert _encoded_sender(exporter) is not None  # this SDK version: the fast path
    assert _encoded_sender(InMemorySpanExporter()) is None
    # another shape: deliberately not the SDK's (private) client class
    exporter._client = cast(Any, SimpleNamespace(export=lambda data, timeout: None))
    assert _encoded_sender(exporter) is None


class _ChangedClient(OTLPSpanExporter):
    """An OTLP exporter whose client looks right but refuses encoded bytes (a future SDK), and
    which keeps what the SDK path hands it."""

    def __init__(self) -> None:
        super().__init__(endpoint="http://127.0.0.1:9/v1/traces")
        self._client = cast(Any, SimpleNamespace(export=self._refuse))  # not the SDK's client
        self.spans: list[Any] = []

    @staticmethod
    def _refuse(data: bytes) -> None:
        raise TypeError("expected a sequence of spans")

    def export(self, spans: Any) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def test_a_client_that_refuses_encoded_bytes_hands_every_span_to_the_sdk(caplog):
    records, resource = _records()
    messages = [pickle.dumps(records), pickle.dumps(records[:1]), b""]
    exporter = _ChangedClient()
    _consume(iter(messages).__next__, resource, exporter, 5, 9, 2)
    assert [span.name for span in exporter.spans] == [r[0] for r in records] + [records[0][0]]
    assert "spans go through the SDK from now on" in caplog.text


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_the_exporter_sends_each_message_in_batches_of_the_batch_size(otlp_collector, compression):
    records, resource = _records()
    messages = [pickle.dumps(records), pickle.dumps(records[:1]), b""]
    exporter = OTLPSpanExporter(endpoint=f"{otlp_collector}/v1/traces", compression=compression)
    _consume(iter(messages).__next__, resource, exporter, 5, 9, 2)
    sizes = [
        sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        for request in OtlpCollector.requests
    ]
    assert sizes == [2, 2, 1, 1]
    names = [
        span.name
        for request in OtlpCollector.requests
        for r in request.resource_spans
        for s in r.scope_spans
        for span in s.spans
    ]
    assert names == [r[0] for r in records] + [records[0][0]]


LIMITS = SpanLimits(
    max_span_attributes=2,
    max_events=1,
    max_links=1,
    max_event_attributes=1,
    max_link_attributes=1,
    max_attribute_length=3,
    max_span_attribute_length=4,
)


def _limited_span(limits: SpanLimits | None) -> ReadableSpan:
    """The same span (ids, times, values) made by the SDK's own tracer under ``limits``."""
    ids = iter([0x1F, 0x2E])

    class Ids(IdGenerator):
        def generate_trace_id(self) -> int:
            return 0xABC

        def generate_span_id(self) -> int:
            return next(ids)

    exporter = InMemorySpanExporter()
    provider = TracerProvider(id_generator=Ids(), span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("smso.test")
    linked = SpanContext(0xDEF, 0x99, True, TraceFlags(1))
    links = [Link(linked, {"a": "long link value", "b": 1}), Link(linked, {"c": "x"})]
    attributes: dict[str, AnyValue] = {
        "url.path": "/classify/very/long",
        "n": 1,
        "tags": ("abcdef", "g"),
    }
    span = tracer.start_span("POST /classify", attributes=attributes, links=links, start_time=10)
    span.add_event("first", {"x": "one", "y": "two"}, timestamp=11)
    span.add_event("second", {"z": "a long message"}, timestamp=12)
    span.end(end_time=20)
    (finished,) = exporter.get_finished_spans()
    return finished


def test_span_limits_cut_and_count_as_the_sdks_own_spans_do(caplog):
    """OTEL_*_LIMIT: the service's records, encoded under the limits, are what the SDK's encoder
    writes for the span its own tracer makes under them (values cut, the last attributes,
    events and links kept, the dropped counted)."""
    raw = to_record(_limited_span(None))  # the span as recorded, before any limit
    sdk = _limited_span(LIMITS)
    expected = encode_spans([sdk]).SerializeToString()
    caplog.clear()
    assert SpanEncoder(sdk.resource, LIMITS)([raw]) == expected
    assert "exceeds max length" not in caplog.text  # not a warning per cut value
    assert "dict is full" not in caplog.text  # nor per dropped attribute
    assert encode_spans([from_record(raw, sdk.resource, {}, LIMITS)]).SerializeToString() == (
        expected
    )  # the SDK path of the exporter process too
    (span,) = ExportTraceServiceRequest.FromString(expected).resource_spans[0].scope_spans[0].spans
    assert {a.key: a.value for a in span.attributes}["tags"].array_value.values[0].string_value == (
        "abcd"
    )
    assert (span.dropped_attributes_count, span.dropped_events_count) == (1, 1)
    assert (span.dropped_links_count, span.events[0].dropped_attributes_count) == (1, 0)


def test_the_default_limits_leave_spans_as_they_are_and_the_environment_sets_them(monkeypatch):
    records, resource = _records()
    assert SpanEncoder(resource)(records) == SpanEncoder(resource, SpanLimits())(records)
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "1")
    request = ExportTraceServiceRequest.FromString(SpanEncoder(resource)(records[:1]))
    (span,) = request.resource_spans[0].scope_spans[0].spans
    assert span.attributes[0].value.string_value == "/"  # "/x", cut to 1
