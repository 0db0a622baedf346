"""What a micro-batcher tells of its work: :class:`BatchObserver`, one method per event.

The batcher calls its observer from the event loop, in this order for a batch: the queue's depth
once the batch is taken, ``batch_ran`` when its outputs are back (before its callers are
answered), ``batch_answered`` once they are. An observer that raises is logged and the batcher
goes on. :class:`NoBatchObserver` does nothing (the default); the server's is
:class:`service.telemetry.batch_telemetry.BatchTelemetry` (metrics and spans).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from service.telemetry.batch_telemetry import QueuedImage
from service.telemetry.metrics import BatchStats

__all__ = ["BatchObserver", "NoBatchObserver"]


class BatchObserver(Protocol):
    """The events of a micro-batcher's queue and batches."""

    def queue_changed(self, depth: int) -> None:
        """``depth`` images wait for inference (after a request's images were queued, and
        after a batch was taken)."""
        ...

    def batch_ran(self, images: Sequence[QueuedImage], start_ns: int, end_ns: int) -> None:
        """A batch of ``images`` ran from ``start_ns`` to ``end_ns`` (``time.time_ns()``)."""
        ...

    def batch_answered(self, stats: BatchStats) -> None:
        """A batch's callers have their rows: what the batch measured."""
        ...


class NoBatchObserver:
    """Observes nothing."""

    def queue_changed(self, depth: int) -> None:
        """Nothing."""

    def batch_ran(self, images: Sequence[QueuedImage], start_ns: int, end_ns: int) -> None:
        """Nothing."""

    def batch_answered(self, stats: BatchStats) -> None:
        """Nothing."""
