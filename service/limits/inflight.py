"""Requests in progress, over both doors (HTTP and gRPC), against ``max_connections``.

Counted per request, not per connection: idle keep-alive connections cost no place (they are
closed after ``keep_alive_s``, and connections that send nothing after ``header_timeout_s``).
Beyond the limit a request is refused at once (503 ``overloaded`` with ``Retry-After``; gRPC's
RESOURCE_EXHAUSTED), counted in ``smso_requests_refused_total``. Health checks and scrapes are
never refused: a probe is answered however busy the server is. One counter on the event loop,
where both doors run: no lock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from service.core.errors import ServiceError

__all__ = ["InFlight"]


class InFlight:
    """At most ``limit`` requests in progress; ``on_refused()`` for each one refused."""

    def __init__(self, limit: int, on_refused: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.count = 0
        self._on_refused = on_refused

    def take(self) -> None:
        """One more request in progress; 503 ``overloaded`` with ``Retry-After`` (taking
        nothing) if the server is at its limit."""
        if self.count >= self.limit:
            if self._on_refused is not None:
                self._on_refused()
            raise ServiceError(
                503,
                "overloaded",
                f"the server has {self.limit} requests in progress (max_connections); retry "
                "shortly",
                headers={"Retry-After": "1"},
            )
        self.count += 1

    def give(self) -> None:
        """A request taken has ended."""
        self.count -= 1

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """:meth:`take` for the duration."""
        self.take()
        try:
            yield
        finally:
            self.give()
