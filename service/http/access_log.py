"""The HTTP door's request ids and access lines: :class:`AccessLog`, the app's outermost layer.

It gives every HTTP request an id (:func:`service.telemetry.access.valid_id`), echoed in the
response's ``X-Request-ID`` header (errors included), opens its span when tracing is on, and logs
its access line when it ends: health checks and scrapes at DEBUG, every other request at INFO.
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Receive, Scope, Send

from service.http.exchange import Exchange
from service.http.request_metrics import counted, labels
from service.telemetry.access import HEADER, RequestRecord, begin, log, log_access, valid_id
from service.telemetry.tracing import Spans

__all__ = ["AccessLog"]

_RAW_HEADER = HEADER.encode()


def _client_id(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == _RAW_HEADER:
            return valid_id(value)
    return None


class AccessLog:
    """Pure ASGI middleware: the request's id (accepted or generated, echoed in the response),
    its trace span when tracing is on (health checks and scrapes have none), and one access
    line when it ends."""

    def __init__(self, app: ASGIApp, spans: Spans | None = None) -> None:
        self.app = app
        self.spans = spans

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        # not reset afterwards: the request's task ends with it, and a last-resort 500 (logged
        # by Starlette's and uvicorn's error handlers, outside this middleware) keeps the id
        record = begin(_client_id(scope))
        exchange = Exchange(receive, send, [(_RAW_HEADER, record.request_id.encode())])
        spans = self.spans if self.spans is not None and counted(scope["path"]) else None
        span = spans.start_request(scope) if spans is not None else None
        error: BaseException | None = None
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except BaseException as raised:
            error = raised
            raise
        finally:
            if spans is not None and span is not None:
                _, label, _ = labels(scope, exchange.status)
                route = None if label == "unmatched" else label
                spans.end_request(span, scope, route, exchange.status, error)
            self._log(scope, exchange.status, record, time.perf_counter() - start)

    @staticmethod
    def _log(scope: Scope, status: int, record: RequestRecord, seconds: float) -> None:
        level = logging.INFO if counted(scope["path"]) else logging.DEBUG
        if not log.isEnabledFor(level):
            return
        method, route, code = labels(scope, status)
        log_access(method, route, int(code) if code.isdigit() else code, record, seconds, level)
