"""OpenTelemetry tracing, when configured: a span per HTTP request (``Spans.start_request``,
opened by ``service.http.access.AccessLog``; health checks and scrapes have none) and per gRPC call
(``Spans.start_rpc``, by ``service.grpc.server``; not the probes), and the service's spans
inside it: ``decode`` (the request's images), and per batch its images ran in ``queue``
(their wait in the model's batcher) and ``inference`` (the batch, with its size and the
request's images in it).

Tracing is on when the standard variables name an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER``, ``OTEL_PROPAGATORS``, ``OTEL_BSP_*`` and the exporter's as usual; the
protocol is http/protobuf); it then needs the ``tracing`` extra (the OpenTelemetry SDK and OTLP
exporter, ``fastapi[opentelemetry]``). Every span is then a plain record, not an SDK span
object, encoded and sent by a child process (``service.telemetry.span_export``): that takes most of
tracing's cost off the serving process. A test's provider gets SDK spans instead. Without an
endpoint nothing is traced: the default install pays an attribute check per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import (
    INVALID_SPAN_ID,
    INVALID_TRACE_ID,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
    Tracer,
    TracerProvider,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import Scope

if TYPE_CHECKING:  # the SDK is the tracing extra's
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.sampling import Sampler

    from service.telemetry.span_export import SpanPipe

__all__ = [
    "TELEMETRY_OFF",
    "TRACER_NAME",
    "RequestSpan",
    "Spans",
    "check_tracing",
    "piped_provider",
    "tracer",
    "tracing_requested",
]

TRACER_NAME = "smso.service"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def tracing_requested() -> bool:
    """Whether the environment asks for traces to be exported (an OTLP endpoint is set and the
    SDK is not disabled)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    return any(os.environ.get(name) for name in _ENDPOINTS)


def check_tracing() -> None:
    """``ValueError`` saying what is wrong when traces are asked for and cannot be exported: the
    SDK is missing, or another protocol than http/protobuf is asked for."""
    if not tracing_requested():
        return
    if (
        importlib.util.find_spec("opentelemetry.sdk") is None
        or importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None
    ):
        raise ValueError(
            "an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT) but the OpenTelemetry SDK or "
            "its OTLP/http exporter is not installed: install the tracing extra "
            "(pip install 'smso[tracing]') or unset it"
        )
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = os.environ.get(name)
        if protocol:
            if protocol != "http/protobuf":
                raise ValueError(
                    f"{name}={protocol!r}: the service exports traces over OTLP http/protobuf "
                    "only; set it to http/protobuf (the default) or unset it"
                )
            break


def piped_provider(
    on_drop: Callable[[int], None] | None = None,
) -> tuple[TracerProvider, SpanPipe]:
    """An SDK tracer provider (resource and sampler from the standard variables) whose spans go
    to an exporter process (``SpanPipe``, told of dropped spans by ``on_drop``; started by the
    app's lifespan)."""
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

    from service.telemetry.span_export import SpanPipe

    provider = SdkTracerProvider(shutdown_on_exit=False)
    pipe = SpanPipe(provider.resource, on_drop=on_drop)
    provider.add_span_processor(pipe)
    return provider, pipe


#: FastAPI's ``telemetry`` setting: all off. The request's span is the service's own
#: (``Spans.start_request``, from ``service.http.access.AccessLog``), metrics are Prometheus's and
#: logs the service's; ``create_app`` sets up the export itself (``piped_provider``).
TELEMETRY_OFF: dict[str, Any] = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "auto_configure": False,
}


def tracer(provider: TracerProvider | None = None) -> Tracer:
    """The service's tracer: from ``provider``, else the global one (a no-op until an SDK
    provider is set, which FastAPI's auto-configuration does)."""
    if provider is not None:
        return provider.get_tracer(TRACER_NAME)
    return trace.get_tracer(TRACER_NAME)


#: the instrumentation scope of the service's own spans, as ``SpanPipe`` records carry it
_SCOPE = (TRACER_NAME, None, None)
_INTERNAL, _SERVER = SpanKind.INTERNAL.value, SpanKind.SERVER.value
_UNSET, _ERROR = StatusCode.UNSET.value, StatusCode.ERROR.value
#: gRPC status codes that are the server's failure (the RPC semantic conventions' list)
_GRPC_SERVER_ERRORS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)


def _trace_id() -> int:
    """A random non-zero 128-bit trace id, as the SDK's ``RandomIdGenerator`` makes them."""
    while (trace_id := random.getrandbits(128)) == INVALID_TRACE_ID:
        pass
    return trace_id


def _span_id() -> int:
    """A random non-zero 64-bit span id, as the SDK's ``RandomIdGenerator`` makes them."""
    while (span_id := random.getrandbits(64)) == INVALID_SPAN_ID:
        pass
    return span_id


def _record(
    name: str,
    trace_of: SpanContext,
    span_id: int,
    parent: SpanContext,
    kind: int,
    start_ns: int,
    end_ns: int,
    attributes: dict[str, Any] | None,
    status: int = _UNSET,
    description: str | None = None,
    events: tuple[tuple[str, int, dict[str, Any]], ...] = (),
) -> tuple[Any, ...]:
    """A span of the service as a ``service.telemetry.span_export.Record``: span ``span_id`` of the
    trace of ``trace_of`` (its id, flags and state), under ``parent`` (invalid: a root)."""
    return (
        name,
        trace_of.trace_id,
        span_id,
        parent.span_id if parent.is_valid else 0,
        parent.is_remote,
        int(trace_of.trace_flags),
        tuple(trace_of.trace_state.items()),
        kind,
        start_ns,
        end_ns,
        attributes or {},
        status,
        description,
        _SCOPE,
        events,
        (),
    )


def _error(error: BaseException) -> tuple[str, tuple[tuple[str, int, dict[str, Any]], ...]]:
    """A span's status description and its ``exception`` event, as the SDK records them."""
    attributes = {"exception.type": type(error).__name__, "exception.message": str(error)}
    return f"{type(error).__name__}: {error}", (("exception", time.time_ns(), attributes),)


#: propagators whose ``fields`` are exactly the headers they read
_W3C = (TraceContextTextMapPropagator, W3CBaggagePropagator)


@functools.lru_cache(maxsize=8)
def _fields(propagator: TextMapPropagator) -> frozenset[str] | None:
    """The header names ``propagator`` reads, lower-case as ASGI gives them, when it is made of
    W3C trace context and baggage only (the default); ``None`` for any other, whose ``fields``
    (the headers it writes) may not list all it reads (B3's ``x-b3-*``, prefixes)."""
    if isinstance(propagator, CompositePropagator):
        parts = getattr(propagator, "_propagators", None)
    else:
        parts = [propagator]
    if parts is None or not all(type(part) in _W3C for part in parts):
        return None
    return frozenset(field.lower() for field in propagator.fields)


def _caller(headers: Iterable[tuple[bytes | str, bytes | str]]) -> otel_context.Context:
    """The caller's context, extracted by the configured propagators from the request headers
    (ASGI's, as bytes; or gRPC metadata, as strings). With the default propagators only the
    headers they read are looked at (``traceparent``, ``tracestate``, ``baggage``), and a
    request with none of them gets an empty context without calling them."""
    propagator = propagate.get_global_textmap()
    fields = _fields(propagator)
    carrier: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1") if isinstance(raw_name, bytes) else raw_name.lower()
        if fields is None or name in fields:
            value = raw_value.decode("latin-1") if isinstance(raw_value, bytes) else raw_value
            carrier[name] = f"{carrier[name]},{value}" if name in carrier else value  # RFC 9110
    if not carrier and fields is not None:
        return otel_context.Context()
    return propagator.extract(carrier)


@dataclass(frozen=True)
class RequestSpan:
    """A request's open span: its context, made current for the request (``token``)."""

    context: SpanContext
    parent: SpanContext  # the caller's (from ``traceparent``), invalid for a new trace
    start_ns: int
    token: Token[Context]
    sdk_span: trace.Span | None  # the SDK's span, when spans are not piped


class Spans:
    """The service's own spans, children of a request's span (only when that one is sampled).

    With ``pipe`` None they are made with ``tracer`` (the SDK's spans when a provider is given,
    the no-op's otherwise). With a ``SpanPipe`` each is one tuple handed to it, about 1 µs
    instead of the SDK's 11 µs, and no encoding in this process.
    """

    def __init__(
        self, tracer: Tracer, pipe: SpanPipe | None = None, sampler: Sampler | None = None
    ) -> None:
        """``sampler``: the provider's, which decides for the request spans made as records."""
        self.tracer = tracer
        self.pipe = pipe
        self.sampler = sampler
        #: whether requests get spans at all: a real provider, not OpenTelemetry's no-op
        self.enabled = pipe is not None or not isinstance(
            tracer, (trace.NoOpTracer, trace.ProxyTracer)
        )

    def start_request(self, scope: Scope) -> RequestSpan | None:
        """Open an HTTP request's span (kind SERVER), child of the caller's span when the
        request carries one (``traceparent``, through the configured propagators), and make it
        the current span for the request; ``None`` when nothing is traced."""
        if not self.enabled:
            return None
        return self._start(_caller(scope["headers"]), scope["method"])

    def start_rpc(
        self, metadata: Iterable[tuple[str, str | bytes]], method: str
    ) -> RequestSpan | None:
        """Open a gRPC call's span (kind SERVER), child of the caller's span when its
        ``metadata`` carries one, current for the call; ``None`` when nothing is traced.
        ``method``: the full method name, ``/package.Service/Method``."""
        if not self.enabled:
            return None
        return self._start(_caller(metadata), method.lstrip("/"))

    def _start(self, caller: otel_context.Context, name: str) -> RequestSpan:
        parent = trace.get_current_span(caller).get_span_context()
        sdk_span = None
        if self.pipe is None:
            sdk_span = self.tracer.start_span(name, caller, kind=SpanKind.SERVER)
            span = sdk_span.get_span_context()
        else:
            trace_id = parent.trace_id if parent.is_valid else _trace_id()
            assert self.sampler is not None
            decision = self.sampler.should_sample(caller, trace_id, name, SpanKind.SERVER)
            sampled = decision.decision.is_sampled()
            flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
            span = SpanContext(trace_id, _span_id(), False, flags, decision.trace_state)
        current = trace.set_span_in_context(sdk_span or trace.NonRecordingSpan(span), caller)
        token = otel_context.attach(current)
        return RequestSpan(span, parent, time.time_ns(), token, sdk_span)

    def end_request(
        self,
        request: RequestSpan,
        scope: Scope,
        route: str | None,
        status: int,
        error: BaseException | None = None,
    ) -> None:
        """Close the request's span, named ``"{method} {route}"``, with the HTTP server
        span's attributes of OpenTelemetry's semantic conventions; a 5xx status or an
        exception makes it an error."""
        otel_context.detach(request.token)
        method = scope["method"]
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "url.scheme": scope.get("scheme", "http"),
            "url.path": scope["path"],
        }
        if scope.get("query_string"):
            attributes["url.query"] = scope["query_string"].decode("latin-1")
        if route is not None:
            attributes["http.route"] = route
        if 100 <= status <= 599:
            attributes["http.response.status_code"] = status
        if scope.get("http_version"):
            attributes["network.protocol.version"] = scope["http_version"]
        if scope.get("server"):
            attributes["server.address"], attributes["server.port"] = scope["server"]
        if scope.get("client"):
            attributes["client.address"] = scope["client"][0]
        if isinstance(error, asyncio.CancelledError):  # the client left: not the server's fault
            error = None
        failed = error is not None or not 100 <= status < 500
        if failed:
            attributes["error.type"] = type(error).__qualname__ if error else str(status)
        self._end(
            request, f"{method} {route}" if route is not None else method, attributes, failed, error
        )

    def end_rpc(
        self,
        request: RequestSpan,
        method: str,
        code: int,
        code_name: str,
        error: BaseException | None = None,
    ) -> None:
        """Close a gRPC call's span, named ``package.Service/Method``, with the RPC span's
        attributes of OpenTelemetry's semantic conventions (``rpc.grpc.status_code``: ``code``,
        grpc's ``StatusCode`` value); a server-side status (``UNKNOWN``, ``DEADLINE_EXCEEDED``,
        ``UNIMPLEMENTED``, ``INTERNAL``, ``UNAVAILABLE``, ``DATA_LOSS``) makes it an error, with
        ``error`` as its exception event when given."""
        otel_context.detach(request.token)
        name = method.lstrip("/")
        service, _, rpc = name.rpartition("/")
        attributes: dict[str, Any] = {
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": rpc,
            "rpc.grpc.status_code": code,
        }
        failed = code_name in _GRPC_SERVER_ERRORS
        if failed:
            attributes["error.type"] = code_name
        self._end(request, name, attributes, failed, error if failed else None)

    def _end(
        self,
        request: RequestSpan,
        name: str,
        attributes: dict[str, Any],
        failed: bool,
        error: BaseException | None,
    ) -> None:
        span = request.sdk_span
        if span is not None:
            span.update_name(name)
            span.set_attributes(attributes)
            if error is not None:
                span.record_exception(error)
            if failed:
                span.set_status(StatusCode.ERROR)
            span.end()
            return
        context = request.context
        if not context.trace_flags.sampled or self.pipe is None:
            return
        description, events = _error(error) if error is not None else (None, ())
        self.pipe.record(
            _record(
                name,
                context,
                context.span_id,
                request.parent,
                _SERVER,
                request.start_ns,
                time.time_ns(),
                attributes,
                _ERROR if failed else _UNSET,
                description,
                events,
            )
        )

    def finished(
        self,
        name: str,
        parent: SpanContext,
        start_ns: int,
        end_ns: int,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        """Record a span that ran from ``start_ns`` to ``end_ns`` (``time.time_ns()``) under
        ``parent``; nothing when the parent is not sampled."""
        if not (parent.is_valid and parent.trace_flags.sampled):
            return
        if self.pipe is None:
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
            span = self.tracer.start_span(name, context, attributes=attributes, start_time=start_ns)
            span.end(end_time=end_ns)
            return
        self.pipe.record(
            _record(name, parent, _span_id(), parent, _INTERNAL, start_ns, end_ns, attributes)
        )

    @contextlib.contextmanager
    def timed(self, name: str, attributes: dict[str, Any] | None = None) -> Iterator[None]:
        """A span over the ``with`` block, under the current span; an exception raised in it
        marks the span as an error (with an ``exception`` event) and goes on."""
        if self.pipe is None:
            with self.tracer.start_as_current_span(name, attributes=attributes):
                yield
            return
        parent = trace.get_current_span().get_span_context()
        if not (parent.is_valid and parent.trace_flags.sampled):
            yield
            return
        start = time.time_ns()
        status, description = _UNSET, None
        events: tuple[tuple[str, int, dict[str, Any]], ...] = ()
        try:
            yield
        except BaseException as error:
            status, (description, events) = _ERROR, _error(error)
            raise
        finally:
            end = time.time_ns()
            self.pipe.record(
                _record(
                    name,
                    parent,
                    _span_id(),
                    parent,
                    _INTERNAL,
                    start,
                    end,
                    attributes,
                    status,
                    description,
                    events,
                )
            )
