"""A bound on the request bodies a server holds in memory at once.

``max_request_bytes`` bounds one body; nothing else bounds how many arrive together.
:class:`BodyBudget` counts the body bytes of the requests in progress as they arrive and holds
them until the request ends; a chunk that would take the total past ``max_buffered_bytes`` is
refused with 503 and ``Retry-After`` before more of the body is read, and so is a body whose
declared ``Content-Length`` does not fit in what is free when it is first read. A declared
length is only checked, never reserved: a client that declares a large body and sends nothing
holds nothing, and cannot lock other uploads out. One counter on the event loop: no lock.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.errors import ServiceError

__all__ = ["BodyBudget", "BufferedBytes"]


class BufferedBytes:
    """Bytes of request bodies held, against a ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, count: int) -> None:
        """Hold ``count`` more bytes; 503 with ``Retry-After`` (holding nothing more) if the
        total would pass the limit."""
        self.check(count)
        self.held += count

    def check(self, count: int) -> None:
        """503 with ``Retry-After`` if ``count`` more bytes would not fit now (taking none)."""
        if self.held + count > self.limit:
            mib = self.limit / 2**20
            raise ServiceError(
                503,
                "overloaded",
                f"the server is holding as many request bodies as it may ({mib:,.1f} MiB, "
                "max_buffered_bytes); retry shortly",
                headers={"Retry-After": "1"},
            )

    def give(self, count: int) -> None:
        self.held -= count


class BodyBudget:
    """Pure ASGI middleware: each HTTP request's body counted against ``buffered()`` as it
    arrives, until the end of the request.

    The checks are made where the app reads the body (``receive``), so the 503 is raised inside
    the route and rendered by the app's error handlers like any other error; a request whose
    body is never read, or never sent, costs nothing.
    """

    def __init__(self, app: ASGIApp, buffered: Callable[[], BufferedBytes]) -> None:
        self.app = app
        self.buffered = buffered

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        budget = self.buffered()
        declared = _content_length(scope)
        held = 0
        checked = False

        async def receive_counted() -> Message:
            nonlocal held, checked
            if not checked and declared:
                budget.check(declared)  # refused at once if it cannot fit, but not reserved
            checked = True
            message = await receive()
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                if size:  # as it arrives: a body that never comes holds nothing
                    budget.take(size)
                    held += size
            return message

        try:
            await self.app(scope, receive_counted, send)
        finally:
            budget.give(held)


def _content_length(scope: Scope) -> int | None:
    """The request's ``Content-Length`` (``None`` if absent or not a number: uvicorn's parser
    refuses a malformed one before the app sees the request)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None
