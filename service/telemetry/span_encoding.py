"""Span records as an OTLP export request, without rebuilding SDK spans.

``SpanEncoder(resource)(records)`` turns a list of ``service.telemetry.span_export.Record`` tuples
into the bytes of one ``ExportTraceServiceRequest`` (opentelemetry-proto's generated classes), field
for field what the SDK's ``encode_spans`` makes of the same spans rebuilt as ``ReadableSpan``
(``service.telemetry.span_export.from_record``): one ``ResourceSpans``, one ``ScopeSpans`` per
instrumentation scope in order of first appearance, and per span

- ids as big-endian bytes (trace 16, span 8, parent 8 when it has one);
- ``kind`` = OpenTelemetry's ``SpanKind`` value + 1 (``SPAN_KIND_INTERNAL`` = 1, ...);
- ``flags`` = ``SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`` (0x100), | 0x200 when the parent is
  remote (links: always, as ``from_record`` makes them);
- ``trace_state`` as its W3C header, ``status`` always present (code, description);
- attributes, events and links with the SDK's value mapping (bool, str, int, float, bytes,
  sequences, mappings; a value it cannot encode is logged and left out, as the SDK does),
  within the span limits the environment sets (``service.telemetry.span_limits``), with the counts
  of what was dropped.

It costs about 3 µs a span where the SDK path (rebuild, batch processor, encoder) costs about
20 µs: the export process's CPU is what tracing every request costs a busy 2-core host.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ResourceMessage
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanMessage
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.trace import SpanKind, StatusCode

from service.telemetry.span_limits import bound_attributes, bound_sequence, default_limits, dropped

__all__ = ["SpanEncoder"]

log = logging.getLogger(__name__)

#: SpanKind's value -> OTLP's enum (the SDK's map)
_KINDS = {kind.value: getattr(SpanMessage, f"SPAN_KIND_{kind.name}") for kind in SpanKind}
_HAS_IS_REMOTE = 0x100  # SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = 0x200  # SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_STATUS_ERROR = StatusCode.ERROR.value


def _value(value: Any, out: AnyValue) -> None:
    """Set ``out`` to ``value`` (``TypeError`` for a type OTLP has no value for)."""
    kind = type(value)
    if kind is str:
        out.string_value = value
    elif kind is bool:
        out.bool_value = value
    elif kind is int:
        out.int_value = value
    elif kind is float:
        out.double_value = value
    elif value is None:
        out.SetInParent()
    elif isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, int):
        out.int_value = value
    elif isinstance(value, float):
        out.double_value = value
    elif isinstance(value, bytes):
        out.bytes_value = value
    elif isinstance(value, Sequence):
        array = out.array_value
        array.SetInParent()
        for item in value:
            _value(item, array.values.add())
    elif isinstance(value, Mapping):
        pairs = out.kvlist_value
        pairs.SetInParent()
        for key, item in value.items():
            _value(item, pairs.values.add(key=str(key)).value)
    else:
        raise TypeError(f"Invalid type {type(value)} of value {value}")


def _attributes(attributes: Mapping[str, Any], out: Any) -> None:
    """Append ``attributes`` to the repeated ``KeyValue`` field ``out``; a key whose value
    cannot be encoded (anywhere inside it) is logged and left out."""
    for key, value in attributes.items():
        item = out.add()
        try:
            item.key = key
            _value(value, item.value)
        except Exception as error:  # as the SDK: an int beyond int64, a lone surrogate, ...
            del out[-1]
            log.error("Failed to encode key %s: %s", key, error)


class SpanEncoder:
    """Records of spans of ``resource`` -> serialised ``ExportTraceServiceRequest`` bytes."""

    def __init__(self, resource: Resource, limits: SpanLimits | None = None) -> None:
        self._limits = limits = limits or default_limits()
        lengths = (limits.max_span_attribute_length, limits.max_attribute_length)
        cuts = any(length is not None for length in lengths)
        #: the fewest entries any count limit allows (a span below it, with no length limit,
        #: is within every limit and is encoded as it is)
        self._fits = -1 if cuts else min(
            (c for c in (limits.max_span_attributes, limits.max_events, limits.max_links,
                         limits.max_event_attributes, limits.max_link_attributes) if c is not None),
            default=2**31,
        )  # fmt: skip
        self._resource = ResourceMessage()
        _attributes(resource.attributes, self._resource.attributes)
        self._schema_url = resource.schema_url
        self._scopes: dict[tuple[Any, ...], InstrumentationScope] = {}

    def _scope(self, scope: tuple[Any, ...]) -> InstrumentationScope:
        message = self._scopes.get(scope)
        if message is None:
            name, version, _ = scope
            message = InstrumentationScope(name=name, version=version)
            self._scopes[scope] = message
        return message

    def __call__(self, records: Sequence[tuple[Any, ...]]) -> bytes:
        request = ExportTraceServiceRequest()
        resource_spans = request.resource_spans.add()
        resource_spans.resource.CopyFrom(self._resource)
        if self._schema_url:
            resource_spans.schema_url = self._schema_url
        by_scope: dict[tuple[Any, ...], ScopeSpans] = {}
        for record in records:
            scope = record[13]
            scope_spans = by_scope.get(scope)
            if scope_spans is None:
                scope_spans = by_scope[scope] = resource_spans.scope_spans.add()
                scope_spans.scope.CopyFrom(self._scope(scope))
                if scope[2]:
                    scope_spans.schema_url = scope[2]
            _span(record, scope_spans.spans.add(), self._limits, self._fits)
        return request.SerializeToString()


def _span(record: tuple[Any, ...], span: SpanMessage, limits: SpanLimits, fits: int) -> None:
    """Fill ``span`` from one record, within ``limits`` (``service.telemetry.span_limits``); a
    record whose attributes, events, links and theirs number at most ``fits``
    (``SpanEncoder._fits``) is within them as it is."""
    name, trace_id, span_id, parent_id, parent_remote, _, state, kind = record[:8]
    start, end, attributes, status, description, _, events, links = record[8:]
    if len(attributes) > fits or ((events or links) and _beyond(events, links, fits)):
        attributes, events, links = _within(span, attributes, events, links, limits)
    span.trace_id = trace_id.to_bytes(16, "big")
    span.span_id = span_id.to_bytes(8, "big")
    if state:
        span.trace_state = ",".join(f"{key}={value}" for key, value in state)
    if parent_id:
        span.parent_span_id = parent_id.to_bytes(8, "big")
    span.name = name
    span.kind = _KINDS[kind]
    span.start_time_unix_nano = start
    span.end_time_unix_nano = end
    span.flags = _HAS_IS_REMOTE | _IS_REMOTE if parent_id and parent_remote else _HAS_IS_REMOTE
    if attributes:
        _attributes(attributes, span.attributes)
    for event_name, timestamp, event_attributes in events:
        event = span.events.add(name=event_name, time_unix_nano=timestamp)
        if (count := dropped(event_attributes)) != 0:
            event.dropped_attributes_count = count
        _attributes(event_attributes, event.attributes)
    for link_trace, link_span, _, link_attributes in links:
        link = span.links.add(
            trace_id=link_trace.to_bytes(16, "big"),
            span_id=link_span.to_bytes(8, "big"),
            flags=_HAS_IS_REMOTE | _IS_REMOTE,
        )
        if (count := dropped(link_attributes)) != 0:
            link.dropped_attributes_count = count
        _attributes(link_attributes, link.attributes)
    span.status.SetInParent()
    if status:
        span.status.code = status
        if description is not None and status == _STATUS_ERROR:  # the SDK keeps no other's
            span.status.message = description


def _beyond(events: Sequence[Any], links: Sequence[Any], fits: int) -> bool:
    """Whether events, links or their attributes number more than ``fits``."""
    return max(len(events), len(links)) > fits or any(
        len(parts[-1]) > fits for parts in (*events, *links)
    )


def _within(
    span: SpanMessage, attributes: Any, events: Any, links: Any, limits: SpanLimits
) -> tuple[Any, Any, Any]:
    """A span's attributes, events and links within ``limits``; the span's dropped counts set
    (an event's or link's travel with its attributes: ``service.telemetry.span_limits.dropped``)."""
    length = limits.max_attribute_length
    attributes = bound_attributes(
        attributes, limits.max_span_attributes, limits.max_span_attribute_length, immutable=False
    )
    events = bound_sequence(events, limits.max_events)
    links = bound_sequence(links, limits.max_links)
    for field, bounded in (("attributes", attributes), ("events", events), ("links", links)):
        if (count := dropped(bounded)) != 0:  # a proto field costs even to set it to 0
            setattr(span, f"dropped_{field}_count", count)
    per_event = limits.max_event_attributes
    events = [(n, t, bound_attributes(a, per_event, length)) for n, t, a in events]
    per_link = limits.max_link_attributes
    links = [(*link[:3], bound_attributes(link[3], per_link, length)) for link in links]
    return attributes, events, links
