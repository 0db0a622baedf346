"""The service's span processor: the SDK's ``BatchSpanProcessor``, with every sampled span that
is not exported counted (``smso_spans_dropped_total``).

The SDK's batch processor, once its queue is full, drops spans with a log line and nothing to
count them by. :class:`CountedBatchSpanProcessor` stands in front of it and its exporter, through
their public interfaces only (``SpanProcessor``, ``SpanExporter``):

- a span is *pending* from its end until its export returns: waiting in the batch processor's
  queue, or in the export under way;
- with ``OTEL_BSP_MAX_QUEUE_SIZE`` (2,048) spans pending, a new one is dropped and counted, never
  waited for: tracing never holds a request up. The batch processor's queue has that size and
  never holds more than the pending spans, so it drops none itself;
- a batch whose export fails (the exporter says so, after its own retries, or raises) is counted.

The rest is the SDK's: the worker thread, the batch size and schedule (``OTEL_BSP_*``), the
last export at shutdown.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.environment_variables import (
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_BSP_MAX_QUEUE_SIZE,
)
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

__all__ = ["CountedBatchSpanProcessor"]

log = logging.getLogger(__name__)

#: the batch processor's defaults (OpenTelemetry's specification)
MAX_QUEUE_SIZE = 2048
MAX_EXPORT_BATCH_SIZE = 512


def _env_int(name: str, default: int) -> int:
    """An ``OTEL_BSP_*`` size; a value that is not a positive integer: the default, warned."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        log.warning("%s=%r is not a positive integer; using %d", name, raw, default)
        return default
    return value


class _Reporting(SpanExporter):
    """``exporter``, telling ``done(spans, exported)`` of every batch it was handed."""

    def __init__(self, exporter: SpanExporter, done: Callable[[int, bool], None]) -> None:
        self.exporter = exporter
        self.done = done

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = SpanExportResult.FAILURE
        try:
            result = self.exporter.export(spans)
        finally:  # an exception goes on to the batch processor, which logs it
            self.done(len(spans), result is SpanExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class CountedBatchSpanProcessor(SpanProcessor):
    """The SDK's ``BatchSpanProcessor`` on ``exporter``, telling ``on_drop(n)`` of every ``n``
    sampled spans not exported: dropped for a full queue (see the module's doc), or in a failed
    export. Thread-safe, as the batch processor is.

    ``max_queue_size`` and ``max_export_batch_size`` default to the ``OTEL_BSP_*`` variables
    (the batch is at most the queue); the batch processor reads the schedule's itself.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        on_drop: Callable[[int], None] | None = None,
        *,
        max_queue_size: int | None = None,
        max_export_batch_size: int | None = None,
        schedule_delay_millis: float | None = None,
    ) -> None:
        self.max_queue_size = max_queue_size or _env_int(OTEL_BSP_MAX_QUEUE_SIZE, MAX_QUEUE_SIZE)
        batch = max_export_batch_size or _env_int(
            OTEL_BSP_MAX_EXPORT_BATCH_SIZE, MAX_EXPORT_BATCH_SIZE
        )
        self.dropped = 0  # sampled spans not exported, so far
        self._on_drop = on_drop
        self._pending = 0  # ended and not yet through an export
        self._closed = False
        self._lock = threading.Lock()
        self._batches = BatchSpanProcessor(
            _Reporting(exporter, self._exported),
            max_queue_size=self.max_queue_size,
            schedule_delay_millis=schedule_delay_millis,
            max_export_batch_size=min(batch, self.max_queue_size),
        )

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is None or not context.trace_flags.sampled:
            return
        with self._lock:
            full = self._closed or self._pending >= self.max_queue_size
            if not full:
                self._pending += 1
        if full:
            self._drop(1)
        else:
            self._batches.on_end(span)

    def _exported(self, spans: int, exported: bool) -> None:
        with self._lock:
            self._pending -= spans
        if not exported:
            self._drop(spans)

    def _drop(self, spans: int) -> None:
        with self._lock:
            first = self.dropped == 0
            self.dropped += spans
        if first:
            log.warning(
                "trace spans are being dropped (export queue full, or the export failed); "
                "smso_spans_dropped_total counts them"
            )
        if self._on_drop is not None:
            self._on_drop(spans)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export every pending span now (the batch processor's ``force_flush``)."""
        return self._batches.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Export what is pending (the batch processor's shutdown: its last export), then stop;
        spans ended from now on are dropped and counted."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._batches.shutdown()
        if self.dropped:
            log.warning("%d trace spans were not exported", self.dropped)
