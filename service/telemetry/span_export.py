"""Spans exported by a child process: the serving process only hands over plain tuples.

OpenTelemetry's Python SDK spends about 11 µs creating and ending a span and about 17 µs encoding
it for OTLP, all under the serving process's GIL. A one-image request of the small model needs
about 1.1 ms of CPU and makes four spans, so the in-process pipeline costs it 10-20 %. Here:

- ``SpanPipe`` is the provider's span processor. An ended SDK span (FastAPI's request span) is
  turned into a :data:`Record`, a tuple of plain values; the service's own spans (decode, queue,
  inference) are recorded as such tuples directly by ``service.telemetry.tracing.Spans``, without
  SDK objects. Records wait in a bounded list; a sender thread pickles them (a few µs per span, in
  C) to a pipe every ``OTEL_BSP_SCHEDULE_DELAY`` ms or once ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``
  wait. Beyond ``OTEL_BSP_MAX_QUEUE_SIZE`` waiting records, new ones are dropped and counted,
  as the SDK's ``BatchSpanProcessor`` does: tracing never blocks a request.
- The child process (:func:`main`, ``python -m service.telemetry.span_export``) encodes each
  message's records as OTLP export requests (``service.telemetry.span_encoding.SpanEncoder``: what
  the SDK's encoder writes for the same spans, at about 3 µs a span instead of the SDK path's 20)
  and sends them
  with the SDK's ``OTLPSpanExporter``'s own client, so the standard variables apply (endpoint,
  headers, timeout, compression, certificates, retries). An SDK without that client gets
  ``ReadableSpan``\\ s rebuilt for its ``BatchSpanProcessor`` and exporter instead. On a busy
  2-core host the child's CPU is what tracing costs the server's throughput, even at a lower
  priority: it runs at niceness 19, the lowest. When the pipe closes (shutdown, or the serving
  process died) it sends what it has and exits.

Given an exporter, ``SpanPipe`` rebuilds the same records in a thread of the serving process and
exports them there instead: tests use it with an in-memory exporter.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import logging
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, Span, SpanLimits, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from service.telemetry.span_limits import bound_attributes, bound_sequence, default_limits

__all__ = ["Record", "SpanPipe", "from_record", "main", "to_record"]

log = logging.getLogger(__name__)

#: One finished span as plain values (picklable, cheap to build):
#: ``(name, trace_id, span_id, parent_span_id (0: a root), parent_is_remote, trace_flags,
#: trace_state (tuple of (key, value)), kind (SpanKind's value), start_ns, end_ns, attributes,
#: status (StatusCode's value), status_description, scope (name, version, schema_url),
#: events (tuple of (name, timestamp_ns, attributes)), links (tuple of (trace_id, span_id,
#: trace_flags, attributes)))``.
Record = tuple[Any, ...]

#: the exporter process's niceness, the lowest: where the cores are busy, serving goes first and
#: the spans wait (in the pipe and the server's queue, then they are dropped and counted); 10
#: measured 0.94-0.99 of untraced throughput on 2 busy cores, 19 0.995
EXPORTER_NICENESS = 19
_SCHEDULE_DELAY_MS = 5000
_MAX_QUEUE_SIZE = 2048
_MAX_EXPORT_BATCH_SIZE = 512


def _env_int(name: str, default: int) -> int:
    """An ``OTEL_BSP_*`` setting; a value that is not a positive integer: the default, warned."""
    raw = os.environ.get(name)
    try:
        value = int(raw) if raw else default
    except ValueError:
        value = 0
    if value <= 0:
        log.warning("%s=%r is not a positive integer; using %d", name, raw, default)
        return default
    return value


def to_record(span: ReadableSpan) -> Record:
    """An ended SDK span as a :data:`Record`."""
    context, parent, scope = span.context, span.parent, span.instrumentation_scope
    assert context is not None  # an ended SDK span always has one
    return (
        span.name,
        context.trace_id,
        context.span_id,
        parent.span_id if parent is not None else 0,
        parent.is_remote if parent is not None else False,
        int(context.trace_flags),
        tuple(context.trace_state.items()),
        span.kind.value,
        span.start_time,
        span.end_time,
        dict(span.attributes or {}),
        span.status.status_code.value,
        span.status.description,
        (scope.name, scope.version, scope.schema_url) if scope is not None else ("", None, None),
        tuple((e.name, e.timestamp, dict(e.attributes or {})) for e in span.events),
        tuple(_link(link) for link in span.links),
    )


def _link(link: Link) -> tuple[int, int, int, dict[str, Any]]:
    context = link.context
    return context.trace_id, context.span_id, int(context.trace_flags), dict(link.attributes or {})


def from_record(
    record: Record,
    resource: Resource,
    scopes: dict[tuple[Any, ...], InstrumentationScope],
    limits: SpanLimits | None = None,
) -> ReadableSpan:
    """The ``ReadableSpan`` a :data:`Record` stands for (``scopes`` caches the scopes made),
    within ``limits`` (default: the environment's) as the SDK's own spans are."""
    name, trace_id, span_id, parent_id, parent_remote, flags, state, kind = record[:8]
    start, end, attributes, status, description, scope, events, links = record[8:]
    limits = limits or default_limits()
    attributes = bound_attributes(
        attributes, limits.max_span_attributes, limits.max_span_attribute_length, immutable=False
    )
    length = limits.max_attribute_length
    events = bound_sequence(
        [
            Event(n, bound_attributes(a, limits.max_event_attributes, length), t)
            for n, t, a in events
        ],
        limits.max_events,
    )
    links = bound_sequence(
        [
            Link(
                SpanContext(t, s, True, TraceFlags(f)),
                bound_attributes(a, limits.max_link_attributes, length),
            )
            for t, s, f, a in links
        ],
        limits.max_links,
    )
    trace_flags, trace_state = TraceFlags(flags), TraceState(list(state))
    if scope not in scopes:
        scopes[scope] = InstrumentationScope(*scope)
    return ReadableSpan(
        name=name,
        context=SpanContext(trace_id, span_id, False, trace_flags, trace_state),
        parent=(
            SpanContext(trace_id, parent_id, parent_remote, trace_flags, trace_state)
            if parent_id
            else None
        ),
        resource=resource,
        attributes=attributes,
        events=events,
        links=links,
        kind=SpanKind(kind),
        status=Status(StatusCode(status), description),
        start_time=start,
        end_time=end,
        instrumentation_scope=scopes[scope],
    )


class _Counted(SpanExporter):
    """An exporter that counts the spans handed to its processor and not yet exported."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.pending = 0
        self._changed = threading.Condition()

    def reserve(self, spans: int, capacity: int) -> None:
        """Wait until ``spans`` more fit within ``capacity`` (or nothing is pending)."""
        with self._changed:
            self._changed.wait_for(lambda: self.pending == 0 or self.pending + spans <= capacity)
            self.pending += spans

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            return self.inner.export(spans)
        finally:
            with self._changed:
                self.pending -= len(spans)
                self._changed.notify_all()

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _otlp_exporter() -> SpanExporter:
    """OTLP over http/protobuf, configured by the standard variables."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _encoded_sender(exporter: SpanExporter) -> Callable[[bytes], object] | None:
    """The SDK's OTLP/http exporter's own client, ``export(serialised request)`` (compression,
    headers, timeout, retries and TLS as the standard variables configure them), when
    ``exporter`` is that exporter and its client takes one ``bytes`` argument; ``None``
    otherwise: another exporter, or an SDK version without that client, and spans go through
    the SDK as a whole."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:  # pragma: no cover - the tracing extra installs it
        return None
    if not isinstance(exporter, OTLPSpanExporter):
        return None
    send = getattr(getattr(exporter, "_client", None), "export", None)
    try:
        inspect.signature(send).bind(b"")  # type: ignore[arg-type]
    except (TypeError, ValueError):  # not a callable, or one of another shape
        return None
    return send


def _consume(
    receive: Callable[[], bytes],
    resource: Resource,
    exporter: SpanExporter,
    schedule_delay_ms: int,
    max_queue_size: int,
    max_export_batch_size: int,
) -> None:
    """Export the records ``receive`` returns (pickled lists) in batches of at most
    ``max_export_batch_size``, until it raises ``EOFError`` or returns ``b""``; then flush and
    shut the exporter down.

    With the OTLP/http exporter, each message is encoded by ``SpanEncoder`` and sent at once by
    the exporter's client: the sending paces the reading, so a slow collector fills the
    server's queue, which counts what it drops. With any other exporter, or once that client
    refuses the encoded bytes, the records are rebuilt as SDK spans for a
    ``BatchSpanProcessor`` (``schedule_delay_ms``, ``max_queue_size``)."""
    messages = _messages(receive)
    limits = default_limits()  # the environment's OTEL_*_LIMIT, read once
    send = _encoded_sender(exporter)
    if send is not None:
        from service.telemetry.span_encoding import SpanEncoder  # the exporter process's only

        try:
            unsent = _send_encoded(
                messages, SpanEncoder(resource, limits), send, max_export_batch_size
            )
        except BaseException:
            exporter.shutdown()
            raise
        if unsent is None:  # the end of the input
            exporter.shutdown()
            return
        messages = itertools.chain([unsent], messages)
    capacity = 2 * max_queue_size  # one full message from the server beyond a full queue
    counted = _Counted(exporter)
    processor = BatchSpanProcessor(
        counted,
        max_queue_size=capacity,
        schedule_delay_millis=schedule_delay_ms,
        max_export_batch_size=max_export_batch_size,
    )
    scopes: dict[tuple[Any, ...], InstrumentationScope] = {}
    try:
        for records in messages:
            # Back-pressure instead of the processor's own drops: while the collector is slow
            # or away, stop reading, so the server's queue fills and counts what it drops.
            counted.reserve(len(records), capacity)
            for record in records:
                processor.on_end(from_record(record, resource, scopes, limits))
    finally:
        processor.shutdown()  # exports what is left


def _messages(receive: Callable[[], bytes]) -> Iterator[list[Record]]:
    """The lists of records ``receive`` returns, until it raises ``EOFError`` or returns
    ``b""``."""
    while True:
        try:
            data = receive()
        except EOFError:
            return
        if not data:
            return
        yield pickle.loads(data)


def _send_encoded(
    messages: Iterator[list[Record]],
    encode: Callable[[Sequence[Record]], bytes],
    send: Callable[[bytes], object],
    batch_size: int,
) -> list[Record] | None:
    """Encode and send each message's records, ``batch_size`` at a time (the client logs
    what it fails to send; a batch that fails otherwise is logged and dropped). ``None`` at the
    end of the input; the records not sent yet if the client turns out not to take encoded
    requests (``TypeError``, ``AttributeError``: another SDK version), for the SDK to export."""
    for records in messages:
        for first in range(0, len(records), batch_size):
            batch = records[first : first + batch_size]
            try:
                data = encode(batch)
            except Exception:
                log.exception("encoding %d spans failed; they are dropped", len(batch))
                continue
            try:
                send(data)
            except (TypeError, AttributeError):
                log.warning(
                    "the OTLP exporter's client does not take encoded requests (another "
                    "OpenTelemetry SDK version?): spans go through the SDK from now on",
                    exc_info=True,
                )
                return records[first:]
            except Exception:
                log.exception("exporting %d spans failed; they are dropped", len(batch))
    return None


def _frame(data: bytes) -> bytes:
    """One message on the pipe: its length (4 bytes, little-endian), then the bytes."""
    return struct.pack("<I", len(data)) + data


def _read_frame(stream: BinaryIO) -> bytes:
    """The next message from ``stream``; ``EOFError`` once the writer has closed it."""
    header = stream.read(4)
    if len(header) < 4:
        raise EOFError
    (size,) = struct.unpack("<I", header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return data


def main() -> None:
    """The exporter process (``python -m service.telemetry.span_export``): its standard input
    carries the resource and the batching settings, then lists of records, to the OTLP endpoint."""
    logging.basicConfig(level=logging.WARNING, format="span exporter: %(levelname)s %(message)s")
    # Ctrl-C or a SIGTERM to the server's whole process group must not cut the last export
    # short: the end of the input is this process's signal to export what it has and exit.
    # First: at the lower priority below, on busy cores, the next line may be a while coming.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # background work: the server keeps the CPU it needs
        os.nice(EXPORTER_NICENESS)
    stdin = sys.stdin.buffer
    try:
        resource_attributes, settings = pickle.loads(_read_frame(stdin))
    except EOFError:
        return
    _consume(lambda: _read_frame(stdin), Resource(resource_attributes), _otlp_exporter(), *settings)


def _start_process() -> subprocess.Popen[bytes]:
    """A Python running :func:`main` of this very module: ``-P`` keeps the working directory
    off its path (a ``service`` folder there would shadow this package), and the folder this
    package is in goes first when it is not on the path already (a checkout, not installed)."""
    root = str(Path(__file__).resolve().parents[2])
    code = (
        "import sys\n"
        f"if {root!r} not in sys.path: sys.path.insert(0, {root!r})\n"
        "from service.telemetry.span_export import main\n"
        "main()\n"
    )
    return subprocess.Popen([sys.executable, "-P", "-c", code], stdin=subprocess.PIPE)


class SpanPipe(SpanProcessor):
    """The provider's span processor: records to an exporter process (see the module's doc).

    ``record`` is what the service's own spans call; ``on_end`` takes the SDK's. Thread-safe.
    ``start()`` (the app's start-up) starts the sender thread and the exporter; records made
    before it wait (up to the queue's size).
    """

    def __init__(
        self,
        resource: Resource,
        exporter: SpanExporter | None = None,
        *,
        schedule_delay_ms: int | None = None,
        max_queue_size: int | None = None,
        max_export_batch_size: int | None = None,
        on_drop: Callable[[int], None] | None = None,
    ) -> None:
        """``exporter`` given: rebuilt and exported by a thread of this process (tests); None:
        by a child process with the OTLP exporter of the standard variables. ``on_drop(n)`` is
        told of every ``n`` spans dropped (the service's metric)."""
        self.resource = resource
        self._on_drop = on_drop
        self._exporter = exporter
        self.schedule_delay_ms = schedule_delay_ms or _env_int(
            "OTEL_BSP_SCHEDULE_DELAY", _SCHEDULE_DELAY_MS
        )
        self.max_queue_size = max_queue_size or _env_int("OTEL_BSP_MAX_QUEUE_SIZE", _MAX_QUEUE_SIZE)
        self.max_export_batch_size = min(
            max_export_batch_size
            or _env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", _MAX_EXPORT_BATCH_SIZE),
            self.max_queue_size,
        )
        self.dropped = 0  # records dropped: queue full, or the exporter gone
        self._records: list[Record] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._send: Callable[[bytes], None] | None = None
        self._send_lock = threading.Lock()
        self._sender: threading.Thread | None = None
        self._consumer: threading.Thread | None = None  # in-process exporter
        self._process: subprocess.Popen[bytes] | None = None  # or the exporter process

    # --- the serving side -------------------------------------------------------------------

    def record(self, record: Record) -> None:
        """Queue one finished span (dropped, and counted, when the queue is full)."""
        with self._lock:
            dropped = len(self._records) >= self.max_queue_size or self._stopping
            if not dropped:
                self._records.append(record)
            full = len(self._records) >= self.max_export_batch_size
        if dropped:
            self._drop(1)
        elif full:
            self._wake.set()

    def _drop(self, spans: int) -> None:
        with self._lock:
            self.dropped += spans
        if self._on_drop is not None and spans:
            self._on_drop(spans)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            self.record(to_record(span))

    # --- the exporter ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the exporter (process or thread) and the sender thread; idempotent."""
        if self._sender is not None:
            return
        settings = (self.schedule_delay_ms, self.max_queue_size, self.max_export_batch_size)
        if self._exporter is not None:
            messages: queue.SimpleQueue[bytes] = queue.SimpleQueue()
            self._consumer = threading.Thread(
                target=_consume,
                args=(messages.get, self.resource, self._exporter, *settings),
                name="smso-span-export",
                daemon=True,
            )
            self._send = messages.put
            self._consumer.start()
        else:
            try:
                self._process = _start_process()
            except OSError as error:
                log.warning("span exporter not started (%s): spans are dropped", error)
            else:
                pipe = self._process.stdin
                assert pipe is not None

                def write(data: bytes) -> None:
                    pipe.write(_frame(data))
                    pipe.flush()

                self._send = write
                self._ship(pickle.dumps((dict(self.resource.attributes), settings)), 0)
        self._sender = threading.Thread(target=self._send_loop, name="smso-span-send", daemon=True)
        self._sender.start()

    def _take(self) -> list[Record]:
        with self._lock:
            records, self._records = self._records, []
        return records

    def _ship(self, data: bytes, spans: int) -> None:
        """Send one message to the exporter; once it is gone, count the spans as dropped."""
        with self._send_lock:  # one writer at a time: messages must not interleave
            if self._send is None:
                self._drop(spans)
                return
            try:
                self._send(data)
            except (OSError, ValueError) as error:  # the exporter process is gone
                log.warning("span exporter gone (%s): spans are dropped from now on", error)
                self._send = None
                self._drop(spans)

    def _flush(self) -> None:
        records = self._take()
        if records:
            self._ship(pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL), len(records))

    def _send_loop(self) -> None:
        while not self._stopping:
            self._wake.wait(self.schedule_delay_ms / 1000)
            self._wake.clear()
            try:
                self._flush()
            except Exception:  # a record that does not pickle, say: drop it, keep sending
                log.exception("sending spans to the exporter failed; they are dropped")

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Hand every waiting record to the exporter (which exports on its own schedule)."""
        self._flush()
        return True

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Send what waits, end the stream and wait for the exporter to export and exit."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True  # records from now on are dropped
        self._wake.set()
        if self._sender is not None:
            self._sender.join(timeout_s)
            if self._sender.is_alive() and self._process is not None:
                # stuck writing to an exporter that does not read: end it, which ends the write
                log.warning("span exporter stopped reading; stopping it")
                self._process.kill()
        self._flush()
        self._ship(b"", 0)  # end of stream
        if self._consumer is not None:
            self._consumer.join(timeout_s)
        if self._process is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()  # type: ignore[union-attr]
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("span exporter did not finish in %.0f s; stopping it", timeout_s)
                self._process.kill()
        if self.dropped:
            log.warning("%d spans were dropped (queue full or exporter gone)", self.dropped)


if __name__ == "__main__":
    main()
