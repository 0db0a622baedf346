"""The Open Inference Protocol's meaning, whatever transport carries it (KServe v2).

Server and model metadata, readiness, the inputs' checks, images from tensors, the answer
tensors and the classification strings: functions that take a parsed
:class:`~service.protocol.codec.InferRequest` and give what the protocol answers. The REST routes
(:mod:`service.http.oip`) and the gRPC service (:mod:`service.grpc.server`) both call them, so
that both answer and refuse alike.

Inputs (exactly one per request):

* ``image``: ``FP32 [N, C, H, W]``, preprocessed as the card says (what ``/classify`` feeds the
  model after decoding);
* ``image_bytes``: ``BYTES [N]``, encoded images (JPEG, PNG, ...), decoded as ``/classify``
  decodes uploads. Binary tensors carry the raw bytes; JSON strings cannot, so in JSON each
  element is the image base64-encoded.

Outputs ``logits`` ``FP32 [N, K]`` and ``embedding`` ``FP32 [N, p]``; with the classification
extension (``"parameters": {"classification": k}`` on ``logits``) the top k classes as
``BYTES [N, k]`` strings ``"score:index:label"``, scores being softmax probabilities (the
``/classify`` scores).
"""

from __future__ import annotations

import base64
import binascii
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np

from service.core.errors import ServiceError, too_large
from service.core.settings import Settings
from service.dataplane.answers import top_classes
from service.dataplane.pipeline import decode_all, run_batched
from service.dataplane.state import ServiceState
from service.dataplane.upload import Upload
from service.models.registry import LoadedModel
from service.models.repository import Repository
from service.protocol.codec import (
    InferRequest,
    InputTensor,
    Offered,
    OutputTensor,
    ProtocolError,
    RequestedOutput,
    decompress,
    listed,
    parse_request,
    quoted,
)
from service.runtime.outputs import BackendOutputs

__all__ = [
    "EXTENSIONS",
    "SERVER_NAME",
    "describe_model",
    "describe_server",
    "index_entries",
    "is_model_ready",
    "is_server_ready",
    "offered",
    "parse",
    "protocol_error",
    "request_deadline",
    "run_inference",
    "served_repository",
]

SERVER_NAME = "smso"
EXTENSIONS = ["classification", "binary_tensor_data"]
TENSOR_INPUT, BYTES_INPUT = "image", "image_bytes"
OUTPUTS = ("logits", "embedding")
#: Answered only when asked for by name, by a model with a typicality reference: each image's
#: typicality score and its p-value, FP32 [N] (see modelcard.typicality).
TYPICALITY_OUTPUTS = ("typicality", "typicality_p_value")


def _server_version() -> str:
    try:
        return version("smso")
    except PackageNotFoundError:
        return "unknown"


def protocol_error(
    status: int, message: str, headers: dict[str, str] | None = None
) -> ServiceError:
    """The protocol's error: ``{"error": message}`` with ``status``."""
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


def offered(model: LoadedModel) -> Offered:
    """The model's input and output names (:func:`describe_model`'s): a request names at most
    as many of each."""
    outputs = OUTPUTS + (TYPICALITY_OUTPUTS if model.typicality is not None else ())
    return Offered(inputs=(TENSOR_INPUT, BYTES_INPUT), outputs=outputs)


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
        raise protocol_error(
            400 if n < 1 else 413, f"input {name!r} holds {n} images; send 1 to {limit} per request"
        )


def _tensor_images(
    state: ServiceState, model: LoadedModel, tensor: InputTensor
) -> list[np.ndarray]:
    spec = model.card.input
    want = (spec.channels, spec.height, spec.width)
    if tensor.datatype != "FP32":
        hint = f" (encoded images go in {BYTES_INPUT!r})" if tensor.datatype == "BYTES" else ""
        raise protocol_error(
            400, f"input {TENSOR_INPUT!r} must be FP32, got {tensor.datatype}{hint}"
        )
    if len(tensor.shape) != 4 or tensor.shape[1:] != want:
        raise protocol_error(
            400,
            f"input {TENSOR_INPUT!r} must have shape [N, {want[0]}, {want[1]}, "
            f"{want[2]}], got {list(tensor.shape)}",
        )
    _batch_size(state, tensor.shape[0], TENSOR_INPUT)
    array = np.asarray(tensor.data, np.float32)
    if not np.isfinite(array).all():
        raise protocol_error(400, f"input {TENSOR_INPUT!r} holds NaN or infinite values")
    return [np.ascontiguousarray(row) for row in array]


def _encoded_images(state: ServiceState, tensor: InputTensor) -> list[Upload]:
    if tensor.datatype != "BYTES":
        raise protocol_error(
            400,
            f"input {BYTES_INPUT!r} must be BYTES (encoded images), got "
            f"{tensor.datatype}; a preprocessed FP32 tensor goes in "
            f"{TENSOR_INPUT!r}",
        )
    if len(tensor.shape) not in (1, 2) or (len(tensor.shape) == 2 and tensor.shape[1] != 1):
        raise protocol_error(
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
        raise protocol_error(
            400,
            f"{name}: BYTES in JSON must be base64-encoded images (raw image "
            "bytes are not valid JSON strings); or send them as binary data "
            "(binary_data_size)",
        ) from None


def _requested(model: LoadedModel, request: InferRequest) -> list[RequestedOutput]:
    """The outputs to answer, checked before any inference runs."""
    if not request.outputs:  # absent or empty: logits and embedding
        return [RequestedOutput(name, request.binary_output) for name in OUTPUTS]
    names = offered(model).outputs
    for output in request.outputs:
        if output.name not in names:
            raise protocol_error(
                400, f"unknown output {quoted(output.name)}; outputs: {', '.join(names)}"
            )
        if output.classification and output.name != "logits":
            raise protocol_error(
                400, f"classification applies to 'logits', not {quoted(output.name)}"
            )
    return request.outputs


def _classification(model: LoadedModel, logits: np.ndarray, k: int) -> list[bytes]:
    """Row-major ``"score:index:label"`` of each image's top ``k`` classes, best first."""
    classes = model.card.classes
    scores, order = top_classes(logits, k)  # (N, K), (N, k)
    return [
        f"{scores[n, i]:f}:{i}:{classes[i]}".encode() for n in range(len(scores)) for i in order[n]
    ]


def _answer(
    model: LoadedModel, wanted: list[RequestedOutput], outputs: BackendOutputs
) -> list[OutputTensor]:
    logits, embedding = outputs.logits, outputs.embedding  # (N, K), (N, p)
    typicality = {"typicality": outputs.typicality, "typicality_p_value": outputs.p_value}
    tensors = []
    for output in wanted:
        if output.classification:
            k = min(output.classification, logits.shape[1])
            strings = _classification(model, logits, k)
            tensors.append(
                OutputTensor("logits", "BYTES", (len(logits), k), strings, output.binary)
            )
        else:
            if output.name in TYPICALITY_OUTPUTS:  # (N,) each, offered only where scored
                scores = typicality[output.name]
                if scores is None:
                    raise ValueError(f"model {model.name} answered no {output.name}")
                array = scores.astype(np.float32)
            else:
                array = logits if output.name == "logits" else embedding
            tensors.append(OutputTensor(output.name, "FP32", array.shape, array, output.binary))
    return tensors


def served_repository(state: ServiceState) -> Repository:
    """The repository served (the routes and RPCs that call this exist only with one)."""
    assert state.repository is not None
    return state.repository


def index_entries(state: ServiceState) -> list[dict[str, str]]:
    """Every model the server knows: name, version, state and, when unavailable, why; then
    what the repository folder holds but passed over (UNAVAILABLE, "skipped: ...")."""
    entries = [state.registry.entries[name].index() for name in state.registry.names()]
    if state.repository is not None:
        entries += [skipped.index() for skipped in state.repository.skipped]
    return entries


def request_deadline(state: ServiceState, request: InferRequest, start: float) -> float:
    """The server's deadline, or the client's ``timeout`` parameter (microseconds) if sooner,
    counted from ``start`` (the request's arrival, as for ``/classify``)."""
    seconds = state.settings.request_timeout_s
    timeout = request.parameters.get("timeout")
    if timeout is not None:
        number = isinstance(timeout, int | float) and not isinstance(timeout, bool)
        if not number or not timeout > 0:
            raise protocol_error(
                400,
                f"parameters.timeout must be a positive number of microseconds, "
                f"got {str(timeout)[:40]!r}",
            )
        if timeout < 1e15:  # beyond: longer than any server deadline (and than a float holds)
            seconds = min(seconds, timeout / 1e6)
    return start + seconds


def parse(
    body: bytes | bytearray,
    encoding: str | None,
    length: int | None,
    settings: Settings,
    model: LoadedModel,
) -> InferRequest:
    """The request to ``model`` from its (possibly compressed) body; :class:`ProtocolError`
    for any flaw."""
    body = decompress(body, encoding, settings.max_request_bytes)
    try:
        return parse_request(
            body, length, settings.max_json_bytes, settings.max_files, offered(model)
        )
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
        names = listed([t.name for t in request.inputs])
        raise protocol_error(400, f"inputs [{names}] not understood: {_expected(model)}")
    tensor = request.inputs[0]
    if tensor.name == TENSOR_INPUT:
        images = _tensor_images(state, model, tensor)
    else:
        images = await decode_all(state, model, _encoded_images(state, tensor), deadline)
    outputs = await run_batched(state, model, images, deadline, route)
    return _answer(model, wanted, outputs)
