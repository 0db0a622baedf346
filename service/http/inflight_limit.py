"""The HTTP door's share of :class:`~service.limits.inflight.InFlight`: each request holds a
place while the app handles it; one beyond the limit gets the service's JSON 503 with
``Retry-After`` (not uvicorn's plain-text one), and health checks and scrapes are never held
back (:func:`service.http.request_metrics.counted`)."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from service.core.errors import ServiceError
from service.http.errors import error_response
from service.http.request_metrics import counted
from service.limits.inflight import InFlight

__all__ = ["HoldInFlight"]


class HoldInFlight:
    """Pure ASGI middleware: every counted HTTP request inside ``inflight()``."""

    def __init__(self, app: ASGIApp, inflight: Callable[[], InFlight]) -> None:
        self.app = app
        self.inflight = inflight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not counted(scope["path"]):
            await self.app(scope, receive, send)
            return
        inflight = self.inflight()
        try:
            inflight.take()
        except ServiceError as refused:
            response = error_response(
                scope, refused.status, refused.code, refused.message, refused.headers
            )
            await response(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            inflight.give()
