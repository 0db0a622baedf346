"""Draining on SIGTERM without dropping requests sent on keep-alive connections.

uvicorn's shutdown closes every idle keep-alive connection at once; a request the client had
already sent on one is lost (reset or EOF), and the response before it did not say the
connection would close. :class:`DrainingServer` first stops accepting connections and turns
on draining, during which :class:`CloseWhenDraining` makes every response say
``Connection: close`` (uvicorn then closes that connection once the response is sent); only
after the keep-alive timeout, when a client that kept a connection idle no longer expects to
use it, does uvicorn's own shutdown run (in-flight requests answered, the rest closed).
Connections the kernel had queued for the listening socket when it stopped accepting are
accepted and answered too (:func:`close_listeners`), not reset.

With several worker processes (``smso-serve --workers N``, :mod:`service.http.workers`) each
worker drains so. What the drain needs of a running uvicorn server beyond its public methods
comes from :mod:`service.http.connections`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.http.connections import event_loop_servers, open_connections, serve_accepted

__all__ = ["CloseWhenDraining", "DrainingServer", "close_listeners"]

log = logging.getLogger("service.drain")  # stable for logging configs


class CloseWhenDraining:
    """Pure ASGI middleware: ``Connection: close`` on every HTTP response while ``draining()``."""

    def __init__(self, app: ASGIApp, draining: Callable[[], bool]) -> None:
        self.app = app
        self.draining = draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start" and self.draining():
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"
                ]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_closing)


class DrainingServer(uvicorn.Server):
    """A uvicorn server that, on shutdown, first stops accepting (answering the connections
    already queued for it: :func:`close_listeners`), calls ``on_drain`` (the app starts
    answering ``Connection: close``) and gives its open connections up to
    ``config.timeout_keep_alive`` seconds to end on their own (a second Ctrl-C, ``force_exit``,
    cuts that short as it cuts uvicorn's own wait)."""

    def __init__(self, config: uvicorn.Config, on_drain: Callable[[], Any]) -> None:
        super().__init__(config)
        self.on_drain = on_drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # stop accepting (uvicorn's shutdown closes them again: no-op); nothing awaited before
        # the backlog is taken, so the event loop accepts nothing in between
        servers = event_loop_servers(self)
        listeners = [sock for server in servers for sock in server.sockets]
        queued = close_listeners(listeners, close=[*servers, *(sockets or [])])
        self.on_drain()
        # served like any other connection, and so answered Connection: close
        await asyncio.gather(*(self._serve_accepted(conn) for conn in queued))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout_keep_alive
        while open_connections(self) and not self.force_exit and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await super().shutdown(sockets)

    async def _serve_accepted(self, conn: socket.socket) -> None:
        """Serve ``conn`` as the server serves the connections it accepts; one that fails to
        start (a TLS handshake) is closed and logged, as asyncio's own accept does."""
        try:
            await serve_accepted(self, conn)
        except Exception as error:  # one client's failure ends only its own connection
            conn.close()
            log.warning("a connection queued at shutdown could not be served: %r", error)


class _Listening(Protocol):
    """A listening socket as the event loop's server shows it (asyncio's TransportSocket,
    uvloop's PseudoSocket, or a socket)."""

    @property
    def family(self) -> int: ...

    @property
    def type(self) -> int: ...

    def fileno(self) -> int: ...


#: ``accept`` errors that Linux reports for a connection that failed while queued; the next one
#: may be fine (``man 2 accept``: treat them like EAGAIN, by retrying)
_RETRY_ACCEPT = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNABORTED", "EPROTO", "ENETDOWN", "ENOPROTOOPT", "EHOSTDOWN", "ENONET",
        "EHOSTUNREACH", "EOPNOTSUPP", "ENETUNREACH",
    )
    if hasattr(errno, name)
)  # fmt: skip


def close_listeners(
    listeners: Sequence[_Listening], close: Sequence[asyncio.Server | socket.socket]
) -> list[socket.socket]:
    """Close ``close`` (the servers and sockets that listen on ``listeners``) without
    resetting the connections queued on them; returns those connections, accepted.

    The kernel completes a client's handshake before the server accepts the connection, and
    closing a listening socket resets every connection still in its backlog, though the client
    may already have sent its request. So the listening sockets are held open (a duplicate of
    each) while ``close`` closes, then the backlog is accepted until it is empty and the
    duplicates closed at once. Where this process held the last descriptor of the socket, a
    connection is then refused or accepted, reset only if it arrives in the microseconds
    between the last ``accept`` and ``close`` (or if this process runs out of descriptors);
    where other processes still hold it (``--workers``), the port goes on listening and they
    accept.
    """
    held: list[socket.socket] = []
    try:
        for sock in listeners:
            try:
                held.append(socket.fromfd(sock.fileno(), sock.family, sock.type))
            except OSError as error:  # out of descriptors: this one closes as it would have
                log.warning("cannot hold a listening socket open to drain it: %r", error)
    finally:
        for item in close:
            item.close()
    queued: list[socket.socket] = []
    for listener in held:
        try:
            listener.setblocking(False)
            while True:
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:  # the backlog is empty
                    break
                except OSError as error:
                    if error.errno in _RETRY_ACCEPT:
                        continue
                    log.warning("stopped accepting queued connections: %r", error)
                    break
                conn.setblocking(False)
                queued.append(conn)
        finally:
            listener.close()
    return queued
