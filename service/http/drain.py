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

With several worker processes (``smso-serve --workers N``), :class:`DrainingSupervisor` runs
uvicorn's supervisor with workers that drain the same way (:class:`DrainingProcess`), and
closes its own copy of the listening socket on SIGTERM, so that the port refuses new
connections once the workers stop accepting instead of queueing them for nobody.
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
from uvicorn.supervisors import multiprocess

__all__ = [
    "CloseWhenDraining",
    "DrainingProcess",
    "DrainingServer",
    "DrainingSupervisor",
    "close_listeners",
]

log = logging.getLogger(__name__)


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
    ``config.timeout_keep_alive`` seconds to end on their own."""

    def __init__(self, config: uvicorn.Config, on_drain: Callable[[], Any]) -> None:
        super().__init__(config)
        self.on_drain = on_drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # stop accepting (uvicorn's shutdown closes them again: no-op); nothing awaited before
        # the backlog is taken, so the event loop accepts nothing in between
        listeners = [sock for server in self.servers for sock in server.sockets]
        queued = close_listeners(listeners, close=[*self.servers, *(sockets or [])])
        self.on_drain()
        # served like any other connection, and so answered Connection: close
        await asyncio.gather(*(self._serve_accepted(conn) for conn in queued))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout_keep_alive
        while self.server_state.connections and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await super().shutdown(sockets)

    async def _serve_accepted(self, conn: socket.socket) -> None:
        """Serve ``conn`` with a protocol made as uvicorn's ``startup`` makes them; a
        connection that fails to start (a TLS handshake) is closed and logged, as asyncio's
        own accept does."""
        config = self.config
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: config.http_protocol_class(  # type: ignore[call-arg]
                    config=config, server_state=self.server_state, app_state=self.lifespan.state
                ),
                conn,
                ssl=config.ssl,
            )
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


def _mark_draining(app: Any) -> None:
    """Turn on draining in the service state of ``app`` (uvicorn's loaded app: the FastAPI app
    inside uvicorn's own middleware, each holding the next as ``.app``)."""
    while app is not None:
        state = getattr(getattr(app, "state", None), "smso", None)
        if state is not None:
            state.draining = True
            return
        app = getattr(app, "app", None)


class DrainingProcess(multiprocess.Process):
    """One of uvicorn's worker processes, serving with a :class:`DrainingServer` that marks its
    own app as draining (the app is built in the worker, from the factory)."""

    @property
    def server(self) -> uvicorn.Server:
        if self._server is None:
            config = self.config
            self._server = DrainingServer(config, lambda: _mark_draining(config.loaded_app))
        return self._server


class DrainingSupervisor(multiprocess.Multiprocess):
    """uvicorn's supervisor of worker processes, whose workers drain (:class:`DrainingProcess`)
    and which stops listening itself on SIGTERM or SIGINT."""

    def run(self) -> None:
        # uvicorn's supervisor makes its workers from the module's ``Process`` in three places
        # (start, restart of a dead worker, SIGHUP): the one name is swapped for the run
        original = multiprocess.Process
        multiprocess.Process = DrainingProcess  # type: ignore[misc]
        try:
            super().run()
        finally:
            multiprocess.Process = original  # type: ignore[misc]

    def handle_term(self) -> None:
        self._stop_listening()
        super().handle_term()

    def handle_int(self) -> None:
        self._stop_listening()
        super().handle_int()

    def _stop_listening(self) -> None:
        for sock in self.sockets:
            sock.close()
