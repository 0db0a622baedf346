"""OpenTelemetry tracing, when configured: a span per HTTP request (``Spans.start_request``,
opened by ``service.http.access_log.AccessLog``; health checks and scrapes have none) and per gRPC
call (``Spans.start_rpc``, by ``service.grpc.server``; not the probes), and the service's spans
inside it: ``decode`` (the request's images), and per batch its images ran in ``queue``
(their wait in the model's batcher) and ``inference`` (the batch, with its size and the
request's images in it).

Tracing is on when the standard variables name an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; the protocol is http/protobuf) and the SDK is not
disabled (``OTEL_SDK_DISABLED``); it then needs the ``tracing`` extra (the OpenTelemetry SDK and
its OTLP/http exporter). :func:`otlp_provider` builds it from the SDK's public parts: a
``TracerProvider`` (resource from ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``), the
``BatchSpanProcessor`` (``OTEL_BSP_*``; its drops counted,
:mod:`service.telemetry.span_batches`) and the ``OTLPSpanExporter`` (``OTEL_EXPORTER_OTLP_*``).
Without an endpoint nothing is traced: a request pays an attribute check.

Sampling: ``ParentBased(TraceIdRatioBased(ratio))``. A caller's sampled trace (``traceparent``)
is always followed and an unsampled one never; of the requests that start a trace, one in
1,000 is sampled by default (:data:`DEFAULT_SAMPLING_RATIO`, 0.001), as NVIDIA Triton samples
by default (its trace ``rate``, 1000): a trace per request would cost a busy server more than
its traces are worth (docs/results/observability.md). ``OTEL_TRACES_SAMPLER_ARG`` sets the ratio
(``1`` traces every request, ``0`` none but a caller's); ``OTEL_TRACES_SAMPLER``, when set,
chooses the sampler as the SDK documents, its argument included.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, Tracer, TracerProvider
from starlette.types import Scope

if TYPE_CHECKING:  # the SDK is the tracing extra's
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "DEFAULT_SAMPLING_RATIO",
    "TELEMETRY_OFF",
    "TRACER_NAME",
    "RequestSpan",
    "Spans",
    "check_tracing",
    "otlp_provider",
    "sampling_ratio",
    "tracer",
    "tracing_requested",
]

TRACER_NAME = "smso.service"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

#: The share of the requests that start a trace which are sampled, unless
#: ``OTEL_TRACES_SAMPLER_ARG`` or ``OTEL_TRACES_SAMPLER`` says otherwise: one in 1,000, NVIDIA
#: Triton's default (``--trace-config rate=1000``).
DEFAULT_SAMPLING_RATIO = 0.001
#: The longest attribute value a span keeps (a client's path, query, user agent...).
MAX_ATTRIBUTE_LENGTH = 1024
#: The samplers ``OTEL_TRACES_SAMPLER`` may name (the SDK's); the ratio ones take a ratio.
SAMPLERS = frozenset(
    {
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    }
)


def tracing_requested() -> bool:
    """Whether the environment asks for traces to be exported (an OTLP endpoint is set and the
    SDK is not disabled)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    return any(os.environ.get(name) for name in _ENDPOINTS)


def sampling_ratio() -> float | None:
    """The ratio of new traces sampled: ``OTEL_TRACES_SAMPLER_ARG``, else
    :data:`DEFAULT_SAMPLING_RATIO`; ``None`` when ``OTEL_TRACES_SAMPLER`` is set (the SDK then
    reads both variables itself). ``ValueError`` for a sampler the SDK does not know or an
    argument that is not from 0 to 1 (the SDK would take either as "trace every request")."""
    named = os.environ.get("OTEL_TRACES_SAMPLER", "").strip()
    if named and named not in SAMPLERS:  # the SDK would trace every request instead
        raise ValueError(
            f"OTEL_TRACES_SAMPLER={named[:40]!r} is not a sampler: one of "
            f"{', '.join(sorted(SAMPLERS))} (unset: one request in 1,000)"
        )
    raw = os.environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    ratio = DEFAULT_SAMPLING_RATIO
    if raw:  # checked whoever reads it: the SDK would take a bad one as 1, every request
        try:
            ratio = float(raw)
        except ValueError:
            ratio = math.nan
        if not 0 <= ratio <= 1:  # NaN too
            raise ValueError(
                f"OTEL_TRACES_SAMPLER_ARG={raw!r}: the share of requests to trace is a number "
                f"from 0 to 1 (unset: {DEFAULT_SAMPLING_RATIO}, one request in 1,000)"
            )
    return None if named else ratio  # named: the SDK makes that sampler from both variables


def check_tracing() -> None:
    """``ValueError`` saying what is wrong when traces are asked for and cannot be exported: the
    SDK is missing, another protocol than http/protobuf is asked for, or the sampling ratio is
    not one."""
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
    sampling_ratio()


def otlp_provider(
    on_drop: Callable[[int], None] | None = None, exporter: SpanExporter | None = None
) -> SdkTracerProvider:
    """The SDK's tracer provider the service exports with (see the module's doc): its sampler,
    and spans batched to ``exporter`` (default: OTLP over http/protobuf, as the standard
    variables configure it), ``on_drop(n)`` told of the sampled spans not exported. Its
    ``shutdown()`` exports the last spans (the app's lifespan calls it)."""
    from opentelemetry.sdk.trace import SpanLimits
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from service.telemetry.span_batches import CountedBatchSpanProcessor

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    ratio = sampling_ratio()
    # None: OTEL_TRACES_SAMPLER is set, and the SDK makes the sampler it names
    sampler = None if ratio is None else ParentBased(TraceIdRatioBased(ratio))
    # a client may force a trace (a sampled traceparent) and send 64 KiB paths: attribute
    # values are cut at MAX_ATTRIBUTE_LENGTH, so 2,048 pending spans hold a few MiB at most,
    # unless OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT asks otherwise
    limit = None if os.environ.get("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT") else MAX_ATTRIBUTE_LENGTH
    provider = SdkTracerProvider(
        sampler=sampler,
        span_limits=SpanLimits(max_span_attribute_length=limit),
        shutdown_on_exit=False,
    )
    provider.add_span_processor(CountedBatchSpanProcessor(exporter, on_drop))
    return provider


#: FastAPI's ``telemetry`` setting: all off. The request's span is the service's own
#: (``Spans.start_request``, from ``service.http.access_log.AccessLog``), metrics are Prometheus's
#: and logs the service's; ``create_app`` sets up the export itself (``otlp_provider``).
TELEMETRY_OFF: dict[str, Any] = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "auto_configure": False,
}


def tracer(provider: TracerProvider | None = None) -> Tracer:
    """The service's tracer: from ``provider``, else the global one (a no-op until an SDK
    provider is set)."""
    if provider is not None:
        return provider.get_tracer(TRACER_NAME)
    return trace.get_tracer(TRACER_NAME)


#: gRPC status codes that are the server's failure (the RPC semantic conventions' list)
_GRPC_SERVER_ERRORS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)


def _caller(headers: Iterable[tuple[bytes | str, bytes | str]]) -> otel_context.Context:
    """The caller's context, extracted by the configured propagators (``OTEL_PROPAGATORS``;
    W3C trace context and baggage by default) from the request headers: ASGI's, as bytes, or
    gRPC metadata, as strings. A repeated header is joined with commas (RFC 9110)."""
    carrier: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1") if isinstance(raw_name, bytes) else raw_name.lower()
        value = raw_value.decode("latin-1") if isinstance(raw_value, bytes) else raw_value
        carrier[name] = f"{carrier[name]},{value}" if name in carrier else value
    return propagate.extract(carrier)


@dataclass(frozen=True)
class RequestSpan:
    """A request's open span, made current for the request (``token``)."""

    span: trace.Span
    token: Token[Context]


def _failed(span: trace.Span, error: BaseException | None) -> None:
    """Mark ``span`` as an error, with ``error`` as its ``exception`` event and description
    when given, as the SDK marks a span its ``with`` block raised through."""
    if error is None:
        span.set_status(StatusCode.ERROR)
        return
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


class Spans:
    """The service's own spans, made with ``tracer`` (the SDK's when a provider is set up,
    OpenTelemetry's no-op otherwise): the request's, and under it the service's, only when the
    request's is sampled."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        #: whether requests get spans at all: a real provider, not OpenTelemetry's no-op
        self.enabled = not isinstance(tracer, (trace.NoOpTracer, trace.ProxyTracer))

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
        span = self.tracer.start_span(name, caller, kind=SpanKind.SERVER)
        token = otel_context.attach(trace.set_span_in_context(span, caller))
        return RequestSpan(span, token)

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
        span = request.span
        if not span.is_recording():  # not sampled: nothing to describe
            return
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
        span.update_name(f"{method} {route}" if route is not None else method)
        span.set_attributes(attributes)
        if failed:
            _failed(span, error)
        span.end()

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
        span = request.span
        if not span.is_recording():
            return
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
        span.update_name(name)
        span.set_attributes(attributes)
        if failed:
            _failed(span, error)
        span.end()

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
        context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        span = self.tracer.start_span(name, context, attributes=attributes, start_time=start_ns)
        span.end(end_time=end_ns)

    @contextlib.contextmanager
    def timed(self, name: str, attributes: dict[str, Any] | None = None) -> Iterator[None]:
        """A span over the ``with`` block, under the current span when that one is sampled
        (else none); an exception raised in it marks the span as an error (with an
        ``exception`` event) and goes on."""
        if not trace.get_current_span().get_span_context().trace_flags.sampled:
            yield
            return
        with self.tracer.start_as_current_span(name, attributes=attributes):
            yield
