"""A model's micro-batcher observed by the server: :class:`BatchTelemetry`, its metrics and spans.

It has the methods of :class:`service.batching.observer.BatchObserver`: the queue's depth goes
to the model's gauge and the total over every model; each batch's sizes and times to the
model's histograms (:meth:`service.telemetry.metrics.Metrics.batch_observer`); and, for each
traced request with images in a batch, a ``queue`` span (from its first image queued to the
batch's start) and an ``inference`` span (the batch, with its size and the request's images in
it), children of the request's span: two spans per request and batch, not per image.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from opentelemetry.trace import SpanContext

from service.telemetry.metrics import BatchStats, Metrics
from service.telemetry.tracing import Spans

__all__ = ["BatchTelemetry", "QueuedImage"]


class QueuedImage(Protocol):
    """An image of a batch, as its spans see it."""

    @property
    def span(self) -> SpanContext:
        """The span of the request that submitted it (invalid when nothing is traced)."""
        ...

    @property
    def enqueued_ns(self) -> int:
        """When it was queued (``time.time_ns()``)."""
        ...


class BatchTelemetry:
    """Model ``model`` at ``version``'s batches as metrics (in ``metrics``) and spans (made by
    ``spans``); ``total_depth``: the images waiting for every model of the server."""

    def __init__(
        self,
        *,
        metrics: Metrics,
        spans: Spans,
        model: str,
        version: str,
        total_depth: Callable[[], int],
    ) -> None:
        self._measured = metrics.batch_observer(model, version)
        self._model_depth = metrics.model_queue_depth.labels(model, version)
        self._queue_depth = metrics.queue_depth
        self._total_depth = total_depth
        self._spans = spans
        self._attributes = {"smso.model": model, "smso.model_version": version}

    def queue_changed(self, depth: int) -> None:
        """The model's gauge, and the total over every model."""
        self._model_depth.set(depth)
        self._queue_depth.set(self._total_depth())

    def batch_ran(self, images: Sequence[QueuedImage], start_ns: int, end_ns: int) -> None:
        """The ``queue`` and ``inference`` spans of each sampled request in the batch."""
        # request (trace and span id) -> (its span, earliest queued, images in this batch)
        first: dict[tuple[int, int], tuple[SpanContext, int, int]] = {}
        for image in images:
            span = image.span
            if span.is_valid and span.trace_flags.sampled:  # else not traced (the default)
                key = (span.trace_id, span.span_id)
                _, queued, count = first.get(key, (span, image.enqueued_ns, 0))
                first[key] = (span, min(queued, image.enqueued_ns), count + 1)
        attributes = {**self._attributes, "smso.batch_size": len(images)}
        for span, queued, count in first.values():
            self._spans.finished("queue", span, queued, start_ns)
            self._spans.finished(
                "inference", span, start_ns, end_ns, {**attributes, "smso.images": count}
            )

    def batch_answered(self, stats: BatchStats) -> None:
        """The batch's size, inference time (in all and by stage) and each image's wait."""
        self._measured(stats)
