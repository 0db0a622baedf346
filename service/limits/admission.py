"""Admission control: a bound on the images a server decodes at once.

The micro-batcher's queue bounds the images waiting for inference; this bounds the work before
it, from a request's arrival to its images' submission: images being decoded and images waiting
for a decode thread. Beyond the bound a request is refused at once (503 with ``Retry-After``)
instead of waiting in an unbounded thread-pool queue past its deadline. One counter on the
event loop: no lock, nothing waits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from service.core.errors import ServiceError

__all__ = ["Admission"]


class Admission:
    """At most ``limit`` images admitted at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    @contextlib.contextmanager
    def admit(self, count: int) -> Iterator[None]:
        """Hold ``count`` images for the duration; 503 with ``Retry-After`` if they do not fit."""
        if self.in_flight + count > self.limit:
            message = f"the server is at capacity ({self.limit} images in flight); retry shortly"
            raise ServiceError(503, "overloaded", message, headers={"Retry-After": "1"})
        self.in_flight += count
        try:
            yield
        finally:
            self.in_flight -= count
