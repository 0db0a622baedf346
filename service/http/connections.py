"""uvicorn's connections where uvicorn has no setting for what the service needs: deadlines on
reading a request, and what the drain (:mod:`service.http.drain`) asks of a running server.

This is the one module that reaches past uvicorn's public API (``uvicorn.Config``, and
``uvicorn.Server`` with its public methods and ``should_exit``). Tested with uvicorn 0.54.0;
pyproject.toml pins that minor version, and tests/service/http/test_connections.py checks every
assumption below, so that a new uvicorn fails there first. What it assumes:

* ``Config(http=...)`` takes an ``asyncio.Protocol`` class, made for each connection as
  ``cls(config=..., server_state=..., app_state=...)``. uvicorn times out only idle keep-alive
  connections; a client that sends its headers or its body a byte at a time holds a connection
  (and, at shutdown, the drain) for as long as it likes: 200 slow-header and 20 slow-body
  connections were still open after 35 s. :class:`TimedHttpProtocol` is uvicorn's httptools
  protocol with a deadline on each request's headers and body, kept by the parser's callbacks
  that the protocol implements (``on_message_begin``, ``on_headers_complete``,
  ``on_message_complete``). Its bounds travel in :class:`ServerConfig`.
* A started ``Server`` holds its event loop's servers in ``servers``, its open connections in
  ``server_state.connections`` and its lifespan (whose ``state`` each connection is given) in
  ``lifespan``. uvicorn's shutdown closes the listening sockets, resetting the connections
  queued on them, and closes idle keep-alive connections at once; the drain does neither, and
  so needs :func:`event_loop_servers`, :func:`open_connections` and :func:`serve_accepted`.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = [
    "ServerConfig",
    "TimedHttpProtocol",
    "event_loop_servers",
    "open_connections",
    "serve_accepted",
]


class ServerConfig(uvicorn.Config):
    """uvicorn's config plus the read bounds of :class:`TimedHttpProtocol` (its HTTP protocol)."""

    def __init__(
        self, app: Any, *, header_timeout_s: float, body_timeout_s: float, **kwargs: Any
    ) -> None:
        super().__init__(app, http=TimedHttpProtocol, **kwargs)
        self.header_timeout_s = header_timeout_s  # connection open or request begun -> headers
        self.body_timeout_s = body_timeout_s  # headers -> the whole body


class TimedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on reading each request's headers and body:
    a connection whose request headers have not all arrived ``header_timeout_s`` after it opened
    or the request began, or whose body has not all arrived ``body_timeout_s`` after its
    headers, is closed (the application then sees the client as gone)."""

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


def event_loop_servers(server: uvicorn.Server) -> list[asyncio.Server]:
    """The event loop's servers that accept ``server``'s connections (after its ``startup``)."""
    return list(server.servers)


def open_connections(server: uvicorn.Server) -> int:
    """How many connections ``server`` has open (idle keep-alive ones included)."""
    return len(server.server_state.connections)


async def serve_accepted(server: uvicorn.Server, conn: socket.socket) -> None:
    """Serve ``conn``, accepted outside the event loop's servers, as ``server`` serves the
    connections they accept: with a protocol made as its ``startup`` makes them."""
    config = server.config
    state, app_state = server.server_state, server.lifespan.state

    def protocol() -> asyncio.Protocol:
        return config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=state, app_state=app_state
        )

    await asyncio.get_running_loop().connect_accepted_socket(protocol, conn, ssl=config.ssl)
