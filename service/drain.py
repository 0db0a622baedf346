"""Draining on SIGTERM without dropping requests sent on keep-alive connections.

uvicorn's shutdown closes every idle keep-alive connection at once; a request the client had
already sent on one is lost (reset or EOF), and the response before it did not say the
connection would close. :class:`DrainingServer` first stops accepting connections and turns
on draining, during which :class:`CloseWhenDraining` makes every response say
``Connection: close`` (uvicorn then closes that connection once the response is sent); only
after the keep-alive timeout, when a client that kept a connection idle no longer expects to
use it, does uvicorn's own shutdown run (in-flight requests answered, the rest closed).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CloseWhenDraining", "DrainingServer"]


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
