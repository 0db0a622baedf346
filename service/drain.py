"""Draining on SIGTERM without dropping requests sent on keep-alive connections.

uvicorn's shutdown closes every idle keep-alive connection at once; a request the client had
already sent on one is lost (reset or EOF), and the response before it did not say the
connection would close. :class:`DrainingServer` first stops accepting connections and turns
on draining, during which :class:`CloseWhenDraining` makes every response say
``Connection: close`` (uvicorn then closes that connection once the response is sent); only
after the keep-alive timeout, when a client that kept a connection idle no longer expects to
use it, does uvicorn's own shutdown run (in-flight requests answered, the rest closed).

With several worker processes (``smso-serve --workers N``), :class:`DrainingSupervisor` runs
uvicorn's supervisor with workers that drain the same way (:class:`DrainingProcess`), and
closes its own copy of the listening socket on SIGTERM, so that the port refuses new
connections once the workers stop accepting instead of queueing them for nobody.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.supervisors import multiprocess

__all__ = ["CloseWhenDraining", "DrainingProcess", "DrainingServer", "DrainingSupervisor"]


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
    """A uvicorn server that, on shutdown, first stops accepting, calls ``on_drain`` (the app
    starts answering ``Connection: close``) and gives its open connections up to
    ``config.timeout_keep_alive`` seconds to end on their own."""

    def __init__(self, config: uvicorn.Config, on_drain: Callable[[], Any]) -> None:
        super().__init__(config)
        self.on_drain = on_drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:  # stop accepting (uvicorn's shutdown does it again: no-op)
            server.close()
        for sock in sockets or []:
            sock.close()
        self.on_drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout_keep_alive
        while self.server_state.connections and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await super().shutdown(sockets)


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
