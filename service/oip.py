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
tensors, the classification strings) lives in the functions here that take a parsed
:class:`~service.oip_codec.InferRequest`; the REST routes and the gRPC service
(``service.grpc_server``) both call them, so that both answer and refuse alike.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
import time
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from service.access import note_model
from service.dependencies import State, authorize
from service.errors import OIP_PREFIX, ServiceError
from service.inputs import Upload, read_body, too_large
from service.oip_codec import (
    HEADER_LENGTH,
    InferRequest,
    InputTensor,
    OutputTensor,
    ProtocolError,
    RequestedOutput,
    decompress,
    encode_response,
    header_schema,
    parse_request,
)
from service.pipeline import Outputs, ServiceState, decode_all, run_batched, top_classes
from service.registry import LoadedModel
from service.schemas import OipIndexEntry, OipModelReady, OipReady, oip_errors
from service.settings import Settings

if TYPE_CHECKING:
    from service.repository import Repository

__all__ = [
    "EXTENSIONS",
    "SERVER_NAME",
    "build_router",
    "describe_model",
    "describe_server",
    "index_entries",
    "is_model_ready",
    "is_server_ready",
    "request_deadline",
    "run_inference",
    "served_repository",
]

SERVER_NAME = "smso"
EXTENSIONS = ["classification", "binary_tensor_data"]
TENSOR_INPUT, BYTES_INPUT = "image", "image_bytes"
OUTPUTS = ("logits", "embedding")
#: Answered only when asked for by name, by a model with a typicality reference: each image's
#: typicality score and its p-value, FP32 [N] (see service.typicality).
TYPICALITY_OUTPUTS = ("typicality", "typicality_p_value")
#: Requests whose JSON part is at least this large (or compressed bodies) are parsed in the
#: decode pool, off the event loop.
INLINE_PARSE_BYTES = 256 * 1024

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


def _server_version() -> str:
    try:
        return version("smso")
    except PackageNotFoundError:
        return "unknown"


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> ServiceError:
    return ServiceError(status, "protocol_error", message, headers)


def describe_server(repository: bool) -> dict[str, Any]:
    """Name, version and extensions (``model_repository`` too when a repository is served)."""
    extensions = EXTENSIONS + (["model_repository"] if repository else [])
    return {"name": SERVER_NAME, "version": _server_version(), "extensions": extensions}


def is_server_ready(state: ServiceState) -> bool:
    """Every model loaded and warmed up, and not draining."""
    return not state.draining and state.registry.readiness() == "ready"


def is_model_ready(state: ServiceState, name: str, version: str | None) -> bool:
    """This model serves and the server is not draining; 404 for a model not served here."""
    try:
        state.registry.lookup(name, version)
    except ServiceError as error:
        if error.status == 404:
            raise
        return False
    return not state.draining


def describe_model(model: LoadedModel) -> dict[str, Any]:
    """The model's inputs and outputs: names, datatypes and shapes (-1: any batch size)."""
    card = model.card
    spec = card.input
    return {
        "name": model.name,
        "versions": [model.version],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {
                "name": TENSOR_INPUT,
                "datatype": "FP32",
                "shape": [-1, spec.channels, spec.height, spec.width],
            },
            {"name": BYTES_INPUT, "datatype": "BYTES", "shape": [-1]},
        ],
        "outputs": [
            {"name": "logits", "datatype": "FP32", "shape": [-1, len(card.classes)]},
            {"name": "embedding", "datatype": "FP32", "shape": [-1, card.model.embedding_dim]},
            *(
                [{"name": name, "datatype": "FP32", "shape": [-1]} for name in TYPICALITY_OUTPUTS]
                if model.typicality is not None
                else []
            ),
        ],
    }


def _expected(model: LoadedModel) -> str:
    spec = model.card.input
    return (
        f"send exactly one input: {TENSOR_INPUT!r} (FP32, shape [N, {spec.channels}, "
        f"{spec.height}, {spec.width}], preprocessed) or {BYTES_INPUT!r} (BYTES, shape [N], "
        "encoded images; base64 strings in JSON, raw bytes as binary data)"
    )


def _batch_size(state: ServiceState, n: int, name: str) -> None:
    limit = state.settings.max_files
    if not 1 <= n <= limit:
        raise _error(
            400 if n < 1 else 413, f"input {name!r} holds {n} images; send 1 to {limit} per request"
        )


def _tensor_images(
    state: ServiceState, model: LoadedModel, tensor: InputTensor
) -> list[np.ndarray]:
    spec = model.card.input
    want = (spec.channels, spec.height, spec.width)
    if tensor.datatype != "FP32":
        hint = f" (encoded images go in {BYTES_INPUT!r})" if tensor.datatype == "BYTES" else ""
        raise _error(400, f"input {TENSOR_INPUT!r} must be FP32, got {tensor.datatype}{hint}")
    if len(tensor.shape) != 4 or tensor.shape[1:] != want:
        raise _error(
            400,
            f"input {TENSOR_INPUT!r} must have shape [N, {want[0]}, {want[1]}, "
            f"{want[2]}], got {list(tensor.shape)}",
        )
    _batch_size(state, tensor.shape[0], TENSOR_INPUT)
    array = np.asarray(tensor.data, np.float32)
    if not np.isfinite(array).all():
        raise _error(400, f"input {TENSOR_INPUT!r} holds NaN or infinite values")
    return [np.ascontiguousarray(row) for row in array]


def _encoded_images(state: ServiceState, tensor: InputTensor) -> list[Upload]:
    if tensor.datatype != "BYTES":
        raise _error(
            400,
            f"input {BYTES_INPUT!r} must be BYTES (encoded images), got "
            f"{tensor.datatype}; a preprocessed FP32 tensor goes in "
            f"{TENSOR_INPUT!r}",
        )
    if len(tensor.shape) not in (1, 2) or (len(tensor.shape) == 2 and tensor.shape[1] != 1):
        raise _error(
            400, f"input {BYTES_INPUT!r} must have shape [N] (or [N, 1]), got {list(tensor.shape)}"
        )
    _batch_size(state, tensor.shape[0], BYTES_INPUT)
    limit = state.settings.max_upload_bytes
    uploads = []
    for i, item in enumerate(tensor.data):
        name = f"{BYTES_INPUT}[{i}]"
        data = item if tensor.binary else _base64(item, name)
        if len(data) > limit:
            raise too_large(name, limit)
        uploads.append(Upload(name, data))
    return uploads


def _base64(text: bytes, name: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _error(
            400,
            f"{name}: BYTES in JSON must be base64-encoded images (raw image "
            "bytes are not valid JSON strings); or send them as binary data "
            "(binary_data_size)",
        ) from None


def _requested(model: LoadedModel, request: InferRequest) -> list[RequestedOutput]:
    """The outputs to answer, checked before any inference runs."""
    if not request.outputs:  # absent or empty: logits and embedding
        return [RequestedOutput(name, request.binary_output) for name in OUTPUTS]
    offered = OUTPUTS + (TYPICALITY_OUTPUTS if model.typicality is not None else ())
    for output in request.outputs:
        if output.name not in offered:
            raise _error(400, f"unknown output {output.name!r}; outputs: {', '.join(offered)}")
        if output.classification and output.name != "logits":
            raise _error(400, f"classification applies to 'logits', not {output.name!r}")
    return request.outputs


def _classification(model: LoadedModel, logits: np.ndarray, k: int) -> list[bytes]:
    """Row-major ``"score:index:label"`` of each image's top ``k`` classes, best first."""
    classes = model.card.classes
    scores, order = top_classes(logits, k)  # (N, K), (N, k)
    return [
        f"{scores[n, i]:f}:{i}:{classes[i]}".encode() for n in range(len(scores)) for i in order[n]
    ]


def _answer(
    model: LoadedModel, wanted: list[RequestedOutput], outputs: list[Outputs]
) -> list[OutputTensor]:
    logits = np.stack([o[0] for o in outputs])  # (N, K)
    embedding = np.stack([o[1] for o in outputs])  # (N, p)
    tensors = []
    for output in wanted:
        if output.classification:
            k = min(output.classification, logits.shape[1])
            strings = _classification(model, logits, k)
            tensors.append(
                OutputTensor("logits", "BYTES", (len(logits), k), strings, output.binary)
            )
        else:
            if output.name in TYPICALITY_OUTPUTS:  # the third output: (score, p-value) per image
                column = TYPICALITY_OUTPUTS.index(output.name)
                array = np.array([o[2][column] for o in outputs], np.float32)
            else:
                array = logits if output.name == "logits" else embedding
            tensors.append(OutputTensor(output.name, "FP32", array.shape, array, output.binary))
    return tensors


def served_repository(state: ServiceState) -> Repository:
    """The repository served (the routes and RPCs that call this exist only with one)."""
    assert state.repository is not None
    return state.repository


def index_entries(state: ServiceState) -> list[dict[str, str]]:
    """Every model the server knows: name, version, state and, when unavailable, why."""
    return [state.registry.entries[name].index() for name in state.registry.names()]


def request_deadline(state: ServiceState, request: InferRequest, start: float) -> float:
    """The server's deadline, or the client's ``timeout`` parameter (microseconds) if sooner,
    counted from ``start`` (the request's arrival, as for ``/classify``)."""
    seconds = state.settings.request_timeout_s
    timeout = request.parameters.get("timeout")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and 0 < timeout < 1e15:
        seconds = min(seconds, timeout / 1e6)
    return start + seconds


def _parse(
    body: bytes | bytearray, encoding: str | None, length: int | None, settings: Settings
) -> InferRequest:
    """The request from its (possibly compressed) body; :class:`ProtocolError` for any flaw."""
    body = decompress(body, encoding, settings.max_request_bytes)
    try:
        return parse_request(body, length, settings.max_json_bytes, settings.max_files)
    except ProtocolError:
        raise
    except (ValueError, TypeError, RecursionError, OverflowError) as error:  # a last resort
        raise ProtocolError(f"malformed request: {error}") from None


async def run_inference(
    state: ServiceState, model: LoadedModel, request: InferRequest, deadline: float, route: str
) -> list[OutputTensor]:
    """The answer tensors to a parsed ``request``: its outputs and input checked, its images
    decoded (or taken from the tensor) and run through ``model``'s batcher by ``deadline``."""
    wanted = _requested(model, request)
    if len(request.inputs) != 1 or request.inputs[0].name not in (TENSOR_INPUT, BYTES_INPUT):
        names = [t.name for t in request.inputs]
        raise _error(400, f"inputs {names} not understood: {_expected(model)}")
    tensor = request.inputs[0]
    if tensor.name == TENSOR_INPUT:
        images = _tensor_images(state, model, tensor)
    else:
        images = await decode_all(state, model, _encoded_images(state, tensor), deadline)
    outputs = await run_batched(state, model, images, deadline, route)
    return _answer(model, wanted, outputs)


async def _infer(state: ServiceState, model: LoadedModel, http: Request, route: str) -> Response:
    note_model(model)
    settings = state.settings
    start = time.perf_counter()
    body = await read_body(http, settings.max_request_bytes)
    raw_length = http.headers.get(HEADER_LENGTH)
    if raw_length is not None and not re.fullmatch(r"\s*[0-9]{1,15}\s*", raw_length):
        raise _error(400, f"{HEADER_LENGTH} must be a number of bytes, got {raw_length!r}")
    length = int(raw_length) if raw_length is not None else None
    encoding = http.headers.get("content-encoding")
    try:
        # the JSON part is what costs: binary tensor data after it is only sliced
        if (length if length is not None else len(body)) < INLINE_PARSE_BYTES and not encoding:
            request = _parse(body, encoding, length, settings)
        else:  # inflating or parsing megabytes would hold up every other request
            loop = asyncio.get_running_loop()
            request = await loop.run_in_executor(
                state.decoder, _parse, body, encoding, length, settings
            )
    except ProtocolError as error:
        raise _error(error.status, str(error)) from None
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
    app's state comes from the :data:`~service.dependencies.State` dependency."""
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
    async def repository_index(state: State) -> list[dict[str, str]]:
        """Every model the server knows: name, version, state (READY, LOADING or UNAVAILABLE;
        an unloaded model leaves the index) and, when unavailable, why."""
        return index_entries(state)

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
