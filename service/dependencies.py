"""FastAPI dependencies the routes share: the API key check and the ready state."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from service.errors import ServiceError
from service.pipeline import ServiceState

__all__ = ["ReadyState", "authorize", "ready_state"]


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
            401, "unauthorized",
            "missing or wrong API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )  # fmt: skip


async def ready_state(request: Request) -> ServiceState:
    """The app's state once the model is warmed up; 503 before (with Retry-After), while
    draining, and for good when the model failed to load or warm up (async: a
    plain def would make FastAPI hop to a worker thread on every request)."""
    state: ServiceState = request.app.state.smso
    if state.failure is not None:  # permanent: no Retry-After, a retry cannot succeed
        raise ServiceError(503, "model_failed", f"the model failed to load: {state.failure}")
    if not state.ready:
        raise ServiceError(503, "not_ready", "the model is loading or the server is draining",
                           headers={"Retry-After": "1"})  # fmt: skip
    return state


ReadyState = Annotated[ServiceState, Depends(ready_state)]
