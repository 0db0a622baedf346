"""FastAPI dependencies the routes share: the app's state, and the API key check."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from service.core.errors import ServiceError
from service.dataplane.state import ServiceState

__all__ = ["State", "authorize", "service_state"]


async def authorize(request: Request) -> None:
    """401 unless the request carries the API key (when one is set), compared in constant time."""
    key = request.app.state.smso.settings.api_key
    if key is None:
        return
    given = request.headers.get("x-api-key")
    auth = request.headers.get("authorization", "")
    if given is None and auth[:7].lower() == "bearer ":
        given = auth[7:].strip()
    expected = key.get_secret_value().encode()
    if given is None or not hmac.compare_digest(given.encode(), expected):
        raise ServiceError(
            401,
            "unauthorized",
            "missing or wrong API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def service_state(request: Request) -> ServiceState:
    """The app's :class:`~service.dataplane.pipeline.ServiceState` (async: a plain def would make
    FastAPI hop to a worker thread on every request)."""
    return request.app.state.smso


#: A route's parameter for the app's state: the one way routes reach it.
State = Annotated[ServiceState, Depends(service_state)]
