"""Every error the HTTP door returns is JSON ``{"error": {"code", "message"}}`` with its status;
under ``/v2`` (the Open Inference Protocol) it is the protocol's ``{"error": "message"}``, and
under ``/v1`` (OpenAI's embeddings) the same object with OpenAI's ``type`` and ``param`` beside
``code`` and ``message``, which OpenAI's clients read (``openai.NotFoundError``'s ``code``...).

The handlers installed by :func:`install_error_handlers` render :class:`ServiceError`, FastAPI's
validation errors (422), Starlette's HTTP errors (404, 405 naming the methods that the route
accepts in its message and its ``Allow`` header, ...), a client that closed the connection before
its request was read (499, nginx's "client closed request": one log line, counted as the client's
doing, not the server's) and, as a last resort, unexpected exceptions (500, logged with their
traceback, never shown to the client).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match
from starlette.types import Scope

from service.core.errors import CLIENT_CLOSED, ServiceError, error_body

__all__ = [
    "OIP_PREFIX",
    "OPENAI_PREFIX",
    "error_payload",
    "error_response",
    "install_error_handlers",
]

log = logging.getLogger("service.errors")

#: Routes under this prefix speak the Open Inference Protocol, errors included: the one place
#: it is written (service.http.oip's router is mounted there, and errors under it are rendered as
#: the protocol's, unknown paths included).
OIP_PREFIX = "/v2"
#: Routes under this prefix speak OpenAI's API (service.http.openai_embeddings): their errors
#: carry OpenAI's fields too.
OPENAI_PREFIX = "/v1"


def _openai_type(status: int) -> str:
    """OpenAI's ``error.type`` for an answer with ``status``."""
    if status == 401:
        return "authentication_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def error_payload(path: str, code: str, message: str, *, status: int) -> dict[str, Any]:
    """The JSON body of an error with ``status`` answering ``path`` (the app's path, without
    its root path): the protocol's ``{"error": message}`` under :data:`OIP_PREFIX`, else
    ``{"error": {"code", "message"}}``, with OpenAI's ``type`` and ``param`` under
    :data:`OPENAI_PREFIX`."""
    if path.startswith(OIP_PREFIX):
        return {"error": message}
    body = error_body(code, message)
    if path == OPENAI_PREFIX or path.startswith(f"{OPENAI_PREFIX}/"):
        return {"error": body["error"] | {"type": _openai_type(status), "param": None}}
    return body


def error_response(
    scope: Scope, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """:func:`error_payload` for the request of ``scope``, as a response."""
    path = scope["path"].removeprefix(scope.get("root_path", ""))
    return JSONResponse(error_payload(path, code, message, status=status), status, headers=headers)


def _render(
    request: Request,
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return error_response(request.scope, status, code, message, headers)


def _validation_message(error: RequestValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
        parts.append(f"{where}: {item.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def _allowed_methods(request: Request) -> list[str]:
    """The methods that the app's routes of ``request``'s path accept, sorted: every route of
    that path, not only the first that Starlette tried (``/readyz`` is a GET and a HEAD route)."""
    allowed: set[str] = set()
    for route in request.app.router.routes:
        methods = getattr(route, "methods", None)
        if methods and route.matches(request.scope)[0] is not Match.NONE:
            allowed |= methods
    return sorted(allowed)


def _method_not_allowed(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """405 saying which methods the route accepts (``/classify accepts POST, not GET``), with
    the ``Allow`` header listing them."""
    allowed = _allowed_methods(request)
    if not allowed:  # (no route of the app: a mounted app's own 405)
        return _render(request, 405, "method_not_allowed", str(exc.detail), exc.headers)
    route = getattr(request.scope.get("route"), "path_format", None) or "this path"
    method = request.method if len(request.method) <= _SHOWN_METHOD else "this method"
    message = f"{route} accepts {_listed(allowed)}, not {method}"
    headers = {**(exc.headers or {}), "Allow": ", ".join(allowed)}
    return _render(request, 405, "method_not_allowed", message, headers)


#: A client's method is named in a 405 when it is at most this long (the standard ones are).
_SHOWN_METHOD = 16


def _listed(words: list[str]) -> str:
    """``A``, ``A and B``, ``A, B and C``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def install_error_handlers(app: FastAPI) -> None:
    """Render every error as ``{"error": {"code", "message"}}`` (``{"error": "message"}`` under
    ``/v2``)."""

    @app.exception_handler(ServiceError)
    async def _service(request: Request, exc: ServiceError) -> JSONResponse:
        return _render(request, exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _render(request, 422, "invalid_request", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 405:
            return _method_not_allowed(request, exc)
        code = {404: "not_found"}.get(exc.status_code, "http_error")
        return _render(request, exc.status_code, code, str(exc.detail), exc.headers)

    @app.exception_handler(ClientDisconnect)
    async def _client_closed(request: Request, exc: ClientDisconnect) -> Response:
        # the route's template, not the raw path: a client's path is not written to the log
        route = getattr(request.scope.get("route"), "path", "an unknown route")
        log.info(
            "the client closed the connection before its %s %s request was read; dropped (%d)",
            request.method[:16],
            route,
            CLIENT_CLOSED,
        )
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _render(request, 500, "internal_error", "the server failed; see its log")
