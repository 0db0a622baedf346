"""Counting and timing HTTP requests into :class:`~service.telemetry.metrics.Metrics`.

Requests are labelled by method, route template (``/classify``, never a raw path) and status,
each from a closed set (:func:`labels`): a client cannot grow the page; health checks and scrapes
(``/healthz``, ``/readyz``, ``/metrics``, and the Open Inference Protocol's ``/v2/health/*`` and
``.../ready``) are not counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from service.http.errors import OIP_PREFIX
from service.http.exchange import Exchange
from service.telemetry.metrics import Metrics

__all__ = ["METHODS", "NOT_COUNTED", "MetricsMiddleware", "counted", "labels"]

NOT_COUNTED = frozenset({"/healthz", "/readyz", "/metrics"})
#: The method label's values besides "other" (RFC 9110's methods and PATCH).
METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)


def counted(path: str) -> bool:
    """False for health checks and scrapes."""
    if path in NOT_COUNTED:
        return False
    return not (
        path.startswith(f"{OIP_PREFIX}/health/")
        or (path.startswith(f"{OIP_PREFIX}/") and path.endswith("/ready"))
    )


def labels(scope: Scope, status: int) -> tuple[str, str, str]:
    """``(method, route, status)`` of a request, each from a closed set whatever the client
    sent: a standard method or "other", one of the app's route templates or "unmatched", and a
    status code of 100-599 (499: the client closed the connection before the answer). A route's
    template is its ``path_format`` (``/models/{model_name}/classify``; a mount's ends in
    ``/{path}``: ``/docs-assets/{path}``)."""
    method = scope["method"] if scope["method"] in METHODS else "other"
    template = getattr(scope.get("route"), "path_format", None) or "unmatched"
    return method, template, str(status) if 100 <= status <= 599 else "other"


class MetricsMiddleware:
    """Pure ASGI middleware: counts and times every request but health checks and scrapes."""

    def __init__(self, app: ASGIApp, metrics: Callable[[], Metrics | None]) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not counted(scope["path"]):
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        exchange = Exchange(receive, send)
        try:
            await self.app(scope, exchange.receive, exchange.send)
        finally:
            metrics = self.metrics()
            if metrics is not None:
                method, template, code = labels(scope, exchange.status)
                metrics.requests.labels(method, template, code).inc()
                metrics.latency.labels(method, template).observe(time.perf_counter() - start)
