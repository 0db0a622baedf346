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
import json
import socket
from http import HTTPStatus
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.http.errors import error_payload

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


#: A request's head (request line and headers) is at most this many bytes, as nginx's
#: ``large_client_header_buffers`` (4 x 8k) allows twice over: 414 past it in the request line,
#: 431 in the headers. httptools sets no bound: a 20 MB header was read whole.
MAX_HEAD_BYTES = 64 * 1024
#: and holds at most this many header fields (Apache's LimitRequestFields): 431 past it
MAX_HEADERS = 100


class TimedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounds on reading each request.

    A deadline: a connection whose request headers have not all arrived ``header_timeout_s``
    after it opened or the request began, or whose body has not all arrived ``body_timeout_s``
    after its headers, is closed (the application then sees the client as gone). A size: a head
    over :data:`MAX_HEAD_BYTES` or with more than :data:`MAX_HEADERS` fields is answered 414 or
    431 and the connection closed before the parser holds more of it. Errors are
    the service's JSON, as every other answer (uvicorn's own 400 is plain text)."""

    config: ServerConfig
    _read_timer: asyncio.TimerHandle | None = None
    _fed_body = False

    def __init__(self, config: ServerConfig, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.config = config
        self._refused = False  # answered and closing: nothing more is parsed or run
        self._next_head()

    def _next_head(self) -> None:
        """What is counted of a request's head, from its first byte."""
        self._in_head = True  # reading a request's line and headers
        self._head_bytes = 0
        self._tail = b""  # the head's last bytes of the previous read (a split \r\n\r\n)
        self._line_done = False  # the request line has ended
        self._line_bytes = 0  # its length so far
        self._fields = 0
        self._outside_body = 0  # bytes read after the head that were no body (trailers)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.config.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:  # the head's bytes in this read: up to its end, if that is here
            seen = self._tail + data
            end = seen.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end + 4 - len(self._tail)
            if not self._line_done:  # the request line's length, for 414 or 431
                line_end = data.find(b"\n")
                self._line_done = line_end >= 0
                self._line_bytes += len(data) if line_end < 0 else line_end + 1
            self._tail = seen[-3:]
            if self._head_bytes > MAX_HEAD_BYTES:  # refused before the parser holds more
                self._refuse_head()
                return
            super().data_received(data)
            return
        self._fed_body = False
        super().data_received(data)
        # a read after the head that gave no body and did not end the request: a chunked
        # body's trailers, which httptools holds as headers (bounded as the head is)
        if not self._refused and not self._in_head and not self._fed_body:
            self._outside_body += len(data)
            if self._outside_body > MAX_HEAD_BYTES:
                self._answer_and_close(
                    431,
                    "headers_too_large",
                    f"the request's trailers are over {MAX_HEAD_BYTES:,} bytes",
                )

    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()  # (the head's count began with its first byte's read)
        self._arm(self.config.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        if not self._refused:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._fields += 1
        if self._fields <= MAX_HEADERS:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._in_head = False
        if self._fields > MAX_HEADERS:
            self._answer_and_close(
                431, "headers_too_large", f"the request has more than {MAX_HEADERS} header fields"
            )
            return
        super().on_headers_complete()
        self._arm(self.config.body_timeout_s)

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        self._fed_body, self._outside_body = True, 0
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        self._disarm()
        self._next_head()  # the next request's

    def send_400_response(self, msg: str) -> None:
        if self._refused:
            return
        self._answer_and_close(
            400,
            "bad_request",
            "the request is not valid HTTP/1.1: its request line or a header could not be read",
        )

    def _refuse_head(self) -> None:
        """414 when the request line is most of the head, else 431; the connection closed."""
        if self._line_bytes > MAX_HEAD_BYTES // 2:
            self._answer_and_close(
                414,
                "uri_too_long",
                f"the request line is longer than {MAX_HEAD_BYTES:,} bytes; send long "
                "queries in a request body",
            )
        else:
            self._answer_and_close(
                431, "headers_too_large", f"the request's headers are over {MAX_HEAD_BYTES:,} bytes"
            )

    def _answer_and_close(self, status: int, code: str, message: str) -> None:
        self._refused = True
        self._disarm()
        path = bytes(getattr(self, "url", b"")).decode("latin-1")  # as far as it was read
        body = json.dumps(error_payload(path, code, message, status=status)).encode()
        reason = HTTPStatus(status).phrase.encode()
        head = b"HTTP/1.1 %d %s\r\n" % (status, reason)
        head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        head += b"connection: close\r\n\r\n"
        self.transport.write(head + body)
        self.transport.close()

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
