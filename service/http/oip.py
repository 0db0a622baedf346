"""The Open Inference Protocol's REST API (KServe v2; what Triton and ``tritonclient`` speak).

Routes, under ``/v2``: server metadata, live and ready; the model's metadata, readiness and
``infer`` (each also under ``/versions/{version}``). The model is the ONNX file being served,
named by its card (``<dataset>-<backbone>-<head>``), version the checkpoint's sha256 prefix.

Inputs (exactly one per request):

* ``image``: ``FP32 [N, C, H, W]``, preprocessed as the card says (what ``/classify`` feeds the
  model after decoding);
* ``image_bytes``: ``BYTES [N]``, encoded images (JPEG, PNG, ...), decoded as ``/classify``
  decodes uploads. Binary tensors carry the raw bytes; JSON strings cannot, so in JSON each
  element is the image base64-encoded.

Outputs ``logits`` ``FP32 [N, K]`` and ``embedding`` ``FP32 [N, p]``, JSON or binary; with the
classification extension (``"parameters": {"classification": k}`` on ``logits``) the top k
classes as ``BYTES [N, k]`` strings ``"score:index:label"``, scores being softmax probabilities
(the ``/classify`` scores). Requests go through the same micro-batcher as ``/classify``.
Errors are the protocol's ``{"error": "..."}`` and say what was expected.

The protocol's meaning (metadata, readiness, the inputs' checks, images from tensors, the answer
tensors, the classification strings) lives in :mod:`service.protocol.semantics`, which the gRPC
service (:mod:`service.grpc.server`) calls too, so that both answer and refuse alike; this module
is the HTTP transport around it.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from service.core.errors import ServiceError
from service.dataplane.state import ServiceState
from service.http.dependencies import State, authorize
from service.http.errors import OIP_PREFIX
from service.http.inputs import read_body
from service.http.schemas import OipIndexEntry, OipModelReady, OipReady, oip_errors
from service.models.registry import LoadedModel
from service.protocol.codec import (
    HEADER_LENGTH,
    ProtocolError,
    encode_response,
    header_schema,
)
from service.protocol.semantics import (
    describe_model,
    describe_server,
    index_entries,
    is_model_ready,
    is_server_ready,
    parse,
    protocol_error,
    request_deadline,
    run_inference,
    served_repository,
)
from service.telemetry.access import note_model

__all__ = ["build_router"]

#: Requests whose JSON part is at least this large (or compressed bodies) are parsed in the
#: decode pool, off the event loop.
INLINE_PARSE_BYTES = 256 * 1024

#: The content types an infer request may declare: JSON, JSON and binary tensors, none, and
#: what ``curl -d`` sends unless told otherwise.
BODY_TYPES = frozenset(
    {"", "application/json", "application/octet-stream", "application/x-www-form-urlencoded"}
)

INFER_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": header_schema(),
                "example": {
                    "inputs": [
                        {
                            "name": "image_bytes",
                            "shape": [1],
                            "datatype": "BYTES",
                            "data": ["<base64 of a JPEG or PNG file>"],
                        }
                    ],
                    "outputs": [
                        {"name": "logits", "parameters": {"classification": 3}},
                        {"name": "embedding"},
                    ],
                },
            },
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
                "description": f"binary tensor extension: JSON header ({HEADER_LENGTH} bytes) "
                "followed by the tensors' bytes",
            },
        },
    }
}


async def _infer(state: ServiceState, model: LoadedModel, http: Request, route: str) -> Response:
    note_model(model)
    settings = state.settings
    start = time.perf_counter()
    kind = http.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in BODY_TYPES and not kind.endswith("+json"):
        raise ServiceError(
            415,
            "unsupported_media_type",
            f"content type {kind[:60]!r} is not the protocol's: send JSON (application/json) or "
            "JSON followed by binary tensors (application/octet-stream, with the "
            f"{HEADER_LENGTH} header); encoded images go base64 in an 'image_bytes' tensor, "
            "or as they are to /classify",
        )
    body = await read_body(http, settings.max_request_bytes)
    raw_length = http.headers.get(HEADER_LENGTH)
    if raw_length is not None and not re.fullmatch(r"\s*[0-9]{1,15}\s*", raw_length):
        raise protocol_error(400, f"{HEADER_LENGTH} must be a number of bytes, got {raw_length!r}")
    length = int(raw_length) if raw_length is not None else None
    encoding = http.headers.get("content-encoding")
    try:
        # the JSON part is what costs: binary tensor data after it is only sliced
        if (length if length is not None else len(body)) < INLINE_PARSE_BYTES and not encoding:
            request = parse(body, encoding, length, settings, model)
        else:  # inflating or parsing megabytes would hold up every other request
            loop = asyncio.get_running_loop()
            request = await loop.run_in_executor(
                state.decoder, parse, body, encoding, length, settings, model
            )
    except ProtocolError as error:
        raise protocol_error(error.status, str(error)) from None
    deadline = request_deadline(state, request, start)
    answer = await run_inference(state, model, request, deadline, route)
    payload, header_length = encode_response(model.name, model.version, request.id, answer)
    if header_length is None:
        return Response(payload, media_type="application/json")
    return Response(
        payload, media_type="application/octet-stream", headers={HEADER_LENGTH: str(header_length)}
    )


def build_router(repository: bool = False) -> APIRouter:
    """The ``/v2`` routes (with ``repository``, the model repository extension's too); the
    app's state comes from the :data:`~service.http.dependencies.State` dependency."""
    router = APIRouter(prefix=OIP_PREFIX, tags=["open inference protocol"])

    @router.get("")
    async def server_metadata() -> dict[str, Any]:
        """Server name, version and the protocol extensions it supports."""
        return describe_server(repository)

    @router.get("/health/live")
    @router.head("/health/live", include_in_schema=False)
    async def server_live() -> dict[str, bool]:
        """200 while the process answers."""
        return {"live": True}

    @router.get(
        "/health/ready",
        response_model=OipReady,
        responses={400: {"model": OipReady, "description": "not ready"}},
    )
    @router.head("/health/ready", include_in_schema=False)
    async def server_ready(state: State) -> JSONResponse:
        """200 once the models are loaded and warmed up; 400 (the protocol's "false") before
        and while draining."""
        ready = is_server_ready(state)
        return JSONResponse({"ready": ready}, 200 if ready else 400)

    # behind the key like the model's metadata: its 404 names the models served here
    ready_responses = {
        400: {"model": OipModelReady, "description": "loading or draining"},
        **oip_errors(401, 404, 422),
    }

    @router.get(
        "/models/{model_name}/ready",
        dependencies=[Depends(authorize)],
        response_model=OipModelReady,
        responses=ready_responses,
    )
    @router.get(
        "/models/{model_name}/versions/{model_version}/ready",
        dependencies=[Depends(authorize)],
        response_model=OipModelReady,
        responses=ready_responses,
    )
    async def model_ready(
        state: State, model_name: str, model_version: str | None = None
    ) -> JSONResponse:
        """200 when this model is served and ready; 400 while loading, unavailable or
        draining."""
        ready = is_model_ready(state, model_name, model_version)
        return JSONResponse({"name": model_name, "ready": ready}, 200 if ready else 400)

    @router.get(
        "/models/{model_name}",
        dependencies=[Depends(authorize)],
        responses=oip_errors(401, 404, 422, 503),
    )
    @router.get(
        "/models/{model_name}/versions/{model_version}",
        dependencies=[Depends(authorize)],
        responses=oip_errors(401, 404, 422, 503),
    )
    async def model_metadata(
        state: State, model_name: str, model_version: str | None = None
    ) -> dict[str, Any]:
        """The model's inputs and outputs: names, datatypes and shapes (-1: any batch size)."""
        return describe_model(note_model(state.registry.lookup(model_name, model_version)))

    infer_responses = oip_errors(400, 401, 404, 413, 415, 422, 503, 504)

    @router.post(
        "/models/{model_name}/infer",
        dependencies=[Depends(authorize)],
        openapi_extra=INFER_BODY,
        response_class=Response,
        responses=infer_responses,
    )
    @router.post(
        "/models/{model_name}/versions/{model_version}/infer",
        dependencies=[Depends(authorize)],
        openapi_extra=INFER_BODY,
        response_class=Response,
        responses=infer_responses,
    )
    async def infer(
        request: Request, state: State, model_name: str, model_version: str | None = None
    ) -> Response:
        """Inference on a preprocessed FP32 tensor or on encoded images (JSON or binary)."""
        route = getattr(
            request.scope.get("route"), "path", f"{OIP_PREFIX}/models/{{model_name}}/infer"
        )
        async with state.registry.using(model_name, model_version) as model:
            return await _infer(state, model, request, route)

    if not repository:
        return router

    # the model repository extension (Triton's): index, load, unload
    @router.post(
        "/repository/index",
        dependencies=[Depends(authorize)],
        response_model=list[OipIndexEntry],
        responses=oip_errors(401),
    )
    async def repository_index(state: State) -> list[dict[str, Any]]:
        """Every model the server knows: name, version, state (READY, LOADING or UNAVAILABLE;
        an unloaded model leaves the index) and, when unavailable, why; for a model serving,
        its gallery as /metadata describes it (and why one was refused)."""
        entries: list[dict[str, Any]] = []
        for entry in index_entries(state):
            served = state.registry.served(entry["name"])
            entries.append(entry | ({} if served is None else served.gallery.describe()))
        return entries

    control_responses = oip_errors(400, 401, 404, 422)

    @router.post(
        "/repository/models/{model_name}/load",
        dependencies=[Depends(authorize)],
        responses=control_responses,
    )
    async def repository_load(state: State, model_name: str) -> dict[str, Any]:
        """Load (or reload) a model from the repository folder; answers once it is serving,
        400 with the reason when it cannot be loaded."""
        await served_repository(state).load(model_name)
        return {}

    @router.post(
        "/repository/models/{model_name}/unload",
        dependencies=[Depends(authorize)],
        responses=control_responses,
    )
    async def repository_unload(state: State, model_name: str) -> dict[str, Any]:
        """Stop serving a model: new requests get 404, those in flight are answered."""
        await served_repository(state).unload(model_name)
        return {}

    return router
