"""FastAPI dependencies the routes share: the app's state, and the API key check."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.dataplane import auth as dataplane
from service.dataplane.state import ServiceState

__all__ = ["State", "authorize", "service_state"]


#: How an HTTP client sends the key, for the 401's message.
HOW = "'Authorization: Bearer <key>' or 'X-API-Key: <key>'"


async def authorize(request: Request) -> None:
    """401 unless the request carries the API key (when one is set): the data plane's check,
    on the request's headers."""
    headers = request.headers
    dataplane.authorize(
        request.app.state.smso.settings.api_key,
        headers.get("x-api-key"),
        headers.get("authorization"),
        HOW,
        {"WWW-Authenticate": "Bearer"},
    )


async def service_state(request: Request) -> ServiceState:
    """The app's :class:`~service.dataplane.state.ServiceState` (async: a plain def would make
    FastAPI hop to a worker thread on every request)."""
    return request.app.state.smso


#: A route's parameter for the app's state: the one way routes reach it.
State = Annotated[ServiceState, Depends(service_state)]
