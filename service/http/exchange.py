"""What one HTTP request ended with, as the middleware that count and log it see it.

:class:`Exchange` wraps a request's ``receive`` and ``send``: it notes the response's status when
the response starts and whether the client disconnected. The request's outcome, :attr:`status`,
is the response's status; without a response it is 499 when the client had left (its work was
stopped) and 500 otherwise (an exception escaped the app). The server also reports
``http.disconnect`` once a response is complete, so a sent 500 stays a 500.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.types import Message, Receive, Send

from service.core.errors import CLIENT_CLOSED

__all__ = ["Exchange"]


class Exchange:
    """One request's ``receive`` and ``send``, watched; ``headers`` are added to its response."""

    def __init__(
        self, receive: Receive, send: Send, headers: Sequence[tuple[bytes, bytes]] = ()
    ) -> None:
        self._receive, self._send, self._headers = receive, send, list(headers)
        self.started: int | None = None  # the response's status, once it starts
        self.gone = False

    async def receive(self) -> Message:
        message = await self._receive()
        self.gone = self.gone or message["type"] == "http.disconnect"
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = message["status"]
            if self._headers:
                message["headers"] = [*message.get("headers", ()), *self._headers]
        await self._send(message)

    @property
    def status(self) -> int:
        """The response's status; without one, 499 if the client left, else 500."""
        if self.started is not None:
            return self.started
        return CLIENT_CLOSED if self.gone else 500
