"""JSON request bodies (``/search``'s vectors, ``/v1/embeddings``): read under the request's byte
limit and validated by a pydantic model, off the event loop when large.

A body that is not JSON, or not what the model describes, is 400 ``invalid_json`` naming each
field that is wrong (at most :data:`SHOWN_PROBLEMS`, never the values sent); a declared content
type other than JSON, or a ``Content-Encoding``, is 415.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from service.core.errors import ServiceError
from service.dataplane.state import ServiceState
from service.http.inputs import read_body

__all__ = ["INLINE_PARSE_BYTES", "is_json", "read_json"]

#: Bodies of at least this many bytes are parsed in the decode pool, off the event loop.
INLINE_PARSE_BYTES = 256 * 1024
#: Problems of a body named in one message at most.
SHOWN_PROBLEMS = 5
#: Content types a JSON body may declare besides ``*/*+json``: JSON, none, and what ``curl -d``
#: sends unless told otherwise.
JSON_TYPES = frozenset({"", "application/json", "application/x-www-form-urlencoded"})

Model = TypeVar("Model", bound=BaseModel)


def _kind(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def is_json(request: Request) -> bool:
    """Whether the request declares a JSON body (``application/json`` or ``*/*+json``)."""
    kind = _kind(request)
    return kind == "application/json" or kind.endswith("+json")


def _where(location: tuple[int | str, ...]) -> str:
    """pydantic's location of a problem as a path and a colon (``input[2]: ``,
    ``embeddings[0][5]: ``); nothing for the body as a whole."""
    where = ""
    for part in location:
        where += f"[{part}]" if isinstance(part, int) else f".{part}" if where else str(part)
    return f"{where}: " if where else ""


def _validated(model: type[Model], body: bytes | bytearray, what: str) -> Model:
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        problems = error.errors(include_url=False, include_input=False)
        listed = "; ".join(
            _where(tuple(item["loc"])) + item["msg"].removeprefix("Value error, ")
            for item in problems[:SHOWN_PROBLEMS]
        )
        more = len(problems) - SHOWN_PROBLEMS
        listed += f" (and {more} more)" if more > 0 else ""
        raise ServiceError(400, "invalid_json", f"{what}: {listed}") from None


async def read_json(state: ServiceState, request: Request, model: type[Model], what: str) -> Model:
    """The request's body as ``model``; ``what`` names the body in errors
    (``"the /search body"``)."""
    kind = _kind(request)
    if kind not in JSON_TYPES and not kind.endswith("+json"):
        raise ServiceError(
            415,
            "unsupported_media_type",
            f"content type {kind[:60]!r} is not accepted here; send {what} as JSON "
            "(application/json)",
        )
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise ServiceError(
            415,
            "unsupported_media_type",
            f"Content-Encoding {encoding[:40]!r} is not accepted here; send the JSON as it is",
        )
    body = await read_body(request, state.settings.max_request_bytes)
    if len(body) < INLINE_PARSE_BYTES:
        return _validated(model, body, what)
    loop = asyncio.get_running_loop()  # parsing megabytes would hold up every other request
    return await loop.run_in_executor(state.decoder, _validated, model, body, what)
