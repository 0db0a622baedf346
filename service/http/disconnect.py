"""Stop a request's work when its client leaves after sending it.

A client that uploads its images and then closes the connection (a timeout on its side, a
cancelled job) no longer wants the answer, but its images would still be decoded, queued and
run, taking the place of requests whose clients are waiting. :class:`CancelWhenGone` watches
the connection once the request's body has been read in full: when the server reports
``http.disconnect`` before the response is complete, the request's handler is cancelled (its
images waiting for a decode thread are dropped and its queued images are skipped by the
batcher), one line is logged and the request is counted as 499 by the metrics.

A client that leaves while still uploading needs no watcher: reading the body fails at once
(Starlette's ``ClientDisconnect``, see :mod:`service.core.errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.errors import CLIENT_CLOSED

__all__ = ["CancelWhenGone"]

log = logging.getLogger("service.errors")


class CancelWhenGone:
    """Pure ASGI middleware: cancel a ``POST`` request's handler when its client disconnects
    after sending the whole body and before the response is complete.

    The handler runs in its own task; once it has received the last body message, one watcher
    task waits on the server's ``receive`` (uvicorn answers it only with ``http.disconnect``,
    when the connection is lost or the response is complete). The handler's own later calls to
    ``receive`` are answered from that watcher, so the server's ``receive`` is never awaited twice
    at once.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        watcher: asyncio.Task[Message] | None = None
        response_complete = False

        async def receive_watched() -> Message:
            nonlocal watcher
            if watcher is not None:  # the body is complete: the next message is the watcher's
                return await asyncio.shield(watcher)
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                watcher = asyncio.ensure_future(receive())
                watcher.add_done_callback(on_message)
            return message

        async def send_tracked(message: Message) -> None:
            nonlocal response_complete
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                response_complete = True
            await send(message)

        handler = asyncio.ensure_future(self.app(scope, receive_watched, send_tracked))
        gone = False

        def on_message(done: asyncio.Task[Message]) -> None:
            nonlocal gone
            if done.cancelled() or done.exception() is not None:
                return
            if done.result()["type"] == "http.disconnect" and not response_complete:
                gone = True
                handler.cancel()

        try:
            await asyncio.shield(handler)
        except asyncio.CancelledError:
            if not gone:  # the server cancelled us (shutdown): pass it on to the handler
                handler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await handler
                raise
            route = getattr(scope.get("route"), "path", "an unknown route")
            log.info(
                "the client closed the connection before the answer to its POST %s; its "
                "work was stopped (%d)",
                route,
                CLIENT_CLOSED,
            )
        finally:
            if watcher is not None and not watcher.done():
                watcher.cancel()
