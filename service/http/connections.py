"""Connection-level bounds uvicorn does not set by itself: how long a client may take to send a
request's headers and then its body.

uvicorn times out only idle keep-alive connections; a client that sends its headers or its body
a byte at a time holds a connection (and, at shutdown, the drain) for as long as it likes: 200
slow-header and 20 slow-body connections were still open after 35 s. :class:`TimedHttpProtocol`
closes a connection whose request headers have not all arrived ``header_timeout_s`` after the
connection opened or the request began, or whose body has not all arrived ``body_timeout_s``
after its headers. The application then sees the client as gone.

The bounds travel in :class:`ServerConfig` (a ``uvicorn.Config``), which ``--workers`` hands to
each worker process.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["ServerConfig", "TimedHttpProtocol"]


class ServerConfig(uvicorn.Config):
    """uvicorn's config plus the read bounds of :class:`TimedHttpProtocol` (its HTTP protocol)."""

    def __init__(
        self, app: Any, *, header_timeout_s: float, body_timeout_s: float, **kwargs: Any
    ) -> None:
        super().__init__(app, http=TimedHttpProtocol, **kwargs)
        self.header_timeout_s = header_timeout_s  # connection open or request begun -> headers
        self.body_timeout_s = body_timeout_s  # headers -> the whole body


class TimedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on reading each request's headers and body."""

    config: ServerConfig
    _read_timer: asyncio.TimerHandle | None = None

    def __init__(self, config: ServerConfig, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.config = config

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.config.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.config.header_timeout_s)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.config.body_timeout_s)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _too_slow(self) -> None:
        self._read_timer = None
        if not self.transport.is_closing():
            self.transport.close()
