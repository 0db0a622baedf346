"""The Open Inference Protocol's gRPC API (KServe v2's ``inference.GRPCInferenceService``, what
Triton serves on port 8001 and ``tritonclient.grpc`` speaks).

The service runs in the HTTP server's process and event loop (``grpc.aio``), on the same
:class:`~service.dataplane.state.ServiceState`: the same registry, decode threads, admission
bounds and micro-batchers, so a gRPC request and a REST request of the same images are batched
together and answered alike. The protocol's meaning (checks, images from tensors, answer
tensors, classification strings) comes from :mod:`service.protocol.semantics`, shared with the
REST routes; this module only turns protocol buffers into
:class:`~service.protocol.codec.InferRequest` and answers back.

RPCs: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelInfer (inputs in
``raw_input_contents``, as ``tritonclient`` sends them, or in typed ``contents``; outputs always
in ``raw_output_contents``), and, when a repository is served, RepositoryIndex,
RepositoryModelLoad and RepositoryModelUnload (else UNIMPLEMENTED, as for every other RPC).
The message stubs are those ``tritonclient[grpc]`` ships (``tritonclient.grpc.service_pb2``),
generated from Triton's published ``grpc_service.proto``.

Errors carry REST's message with the status of their canonical code
(:attr:`service.core.errors.ServiceError.canonical`); with an API key, the model RPCs need it in
the metadata (``authorization: Bearer <key>`` or ``x-api-key``), checked before the message is
read (:class:`KeyFirst`). A message is at most ``max_request_bytes`` (grpcio refuses a larger one
with RESOURCE_EXHAUSTED before reading it), and counts against ``max_buffered_bytes`` with the
REST bodies while it is held. Its structure is bounded too, counted on its bytes before it is
parsed (:data:`MAX_FIELDS`), as are its inputs and outputs (no more than the model has), a
connection's streams (:data:`STREAMS_PER_CONNECTION`, against HTTP/2 rapid reset) and an error's
message (:data:`MAX_DETAILS_BYTES`, what a client can read).
The server binds with ``SO_REUSEPORT`` (grpcio's default), which lets the worker processes of
``smso-serve --workers N`` share the port; ``smso-serve`` checks beforehand that no other process
listens there.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from service.core.errors import Canonical, ServiceError, canonical
from service.dataplane.auth import authorize
from service.dataplane.state import ServiceState
from service.grpc.wire import check_structure
from service.protocol import semantics as oip
from service.protocol.codec import (
    DATATYPES,
    InferRequest,
    InputTensor,
    Offered,
    OutputTensor,
    ProtocolError,
    binary_tensor,
    check_counts,
    check_input,
    quoted,
    requested_outputs,
    tensor_bytes,
)
from service.telemetry import access

__all__ = [
    "KEYED",
    "MAX_DETAILS_BYTES",
    "AdmitAndParse",
    "InferenceService",
    "KeyFirst",
    "details",
    "start_grpc_server",
    "status_code",
]

log = logging.getLogger("service")

#: ModelInfer's route, as the images counter and traces label it.
INFER_ROUTE = "/inference.GRPCInferenceService/ModelInfer"

#: Each datatype's field of ``InferTensorContents`` (FP16 has none: it goes as raw contents).
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

Reply = TypeVar("Reply")

#: What is still answered once SIGTERM has arrived (the HTTP side closes its listening socket;
#: gRPC's open channels would go on bringing new calls): liveness and readiness, which say so.
_WHILE_DRAINING = frozenset({"ServerLive", "ServerReady", "ModelReady"})


#: The RPCs that need the API key (when one is set): the model's and the repository's. Not
#: liveness, readiness, the server's metadata, nor the RPCs this server does not offer
#: (UNIMPLEMENTED for everyone).
KEYED = frozenset(
    {
        "ModelReady",
        "ModelMetadata",
        "ModelInfer",
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
    }
)
#: The RPCs that hold a place among the requests in progress (the model's work: not readiness).
ADMITTED = KEYED - {"ModelReady"}
#: How a gRPC client sends the key, for UNAUTHENTICATED's message.
HOW = "metadata 'authorization: Bearer <key>' or 'x-api-key: <key>'"
#: The longest error message sent (``grpc-message``, a trailer): clients refuse trailers over 8
#: KiB (grpc core's default ``grpc.max_metadata_size``) and see "Stream removed" instead, and
#: percent-encoding may triple the bytes of a message that is not ASCII.
MAX_DETAILS_BYTES = 2048
#: Fields a message may hold (its sub-messages' included) beyond one per BYTES element allowed
#: (``max_files``): a ModelInfer request needs a few dozen; checked before it is parsed.
MAX_FIELDS = 1024
#: HTTP/2 streams one connection may have open at once, at least (``max_connections`` if more).
STREAMS_PER_CONNECTION = 1000
#: Each RPC's request type, by method name (for :func:`check_structure`).
_REQUEST_TYPES = {
    method.name: method.input_type
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
}


def details(message: str) -> str:
    """``message`` cut to :data:`MAX_DETAILS_BYTES` bytes of UTF-8, saying how long it was."""
    data = message.encode()
    if len(data) <= MAX_DETAILS_BYTES:
        return message
    tail = f"... ({len(data):,} bytes in all)"
    head = data[: MAX_DETAILS_BYTES - len(tail)].decode(errors="ignore")
    return head + tail


def status_code(canonical: Canonical) -> grpc.StatusCode:
    """The gRPC status of a canonical code (they share their names)."""
    return grpc.StatusCode[canonical.value]


def _parameters(parameters: Any) -> dict[str, Any]:
    """A protobuf ``map<string, InferParameter>`` as plain values."""
    out = {}
    for key, value in parameters.items():
        choice = value.WhichOneof("parameter_choice")
        out[key] = None if choice is None else getattr(value, choice)
    return out


def _input(tensor: Any, raw: bytes | None, max_elements: int) -> InputTensor:
    """One ``ModelInferRequest.InferInputTensor``, its data from ``raw`` or its contents."""
    name, datatype = tensor.name, tensor.datatype
    shape = check_input(
        name, datatype, list(tensor.shape), _parameters(tensor.parameters), max_elements
    )
    if raw is not None:
        return InputTensor(name, datatype, shape, binary_tensor(raw, name, datatype, shape), True)
    field = _CONTENTS.get(datatype)
    if field is None:
        raise ProtocolError(f"input {quoted(name)}: {datatype} goes in raw_input_contents")
    values = getattr(tensor.contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise ProtocolError(
            f"input {quoted(name)}: shape {list(shape)} needs {count} elements, "
            f"contents.{field} has {len(values)}"
        )
    if datatype == "BYTES":  # raw bytes, as in binary data (JSON's base64 is JSON's only)
        return InputTensor(name, datatype, shape, list(values), True)
    try:  # a value out of its datatype's range (300 as INT8) is refused, not wrapped
        with np.errstate(over="raise", invalid="raise"):
            array = np.array(values, DATATYPES[datatype]).reshape(shape)
    except (OverflowError, FloatingPointError, ValueError):
        raise ProtocolError(f"input {quoted(name)}: contents do not fit {datatype}") from None
    return InputTensor(name, datatype, shape, array, True)


def infer_request(message: Any, max_elements: int, offered: Offered | None = None) -> InferRequest:
    """A ``ModelInferRequest`` as the REST side parses it (:class:`ProtocolError` for a flaw),
    its inputs and outputs counted against ``offered`` (the model's) before any is read."""
    check_counts(len(message.inputs), len(message.outputs), offered)
    raw = list(message.raw_input_contents)
    if raw and len(raw) != len(message.inputs):
        raise ProtocolError(
            f"raw_input_contents holds {len(raw)} tensors for "
            f"{len(message.inputs)} inputs; send one per input or none"
        )
    for tensor in message.inputs:  # every input well-formed (else 400) before any too large
        check_input(
            tensor.name, tensor.datatype, list(tensor.shape), _parameters(tensor.parameters), None
        )
    inputs = [
        _input(tensor, raw[i] if raw else None, max_elements)
        for i, tensor in enumerate(message.inputs)
    ]
    # always raw contents: "binary" is REST's choice only
    outputs = requested_outputs(
        ((o.name, _parameters(o.parameters)) for o in message.outputs), True
    )
    return InferRequest(
        message.id or None, inputs, outputs or None, True, _parameters(message.parameters)
    )


def infer_response(model: Any, request_id: str, answer: list[OutputTensor]) -> Any:
    """The answer tensors as a ``ModelInferResponse``, each in ``raw_output_contents``."""
    response = pb.ModelInferResponse(
        model_name=model.name, model_version=model.version, id=request_id
    )
    for tensor in answer:
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.append(tensor_bytes(tensor))
    return response


def _rpc(
    handler: Callable[[InferenceService, Any, grpc.aio.ServicerContext], Awaitable[Reply]],
) -> Callable[[InferenceService, Any, grpc.aio.ServicerContext], Awaitable[Reply]]:
    """An RPC whose :class:`ServiceError` becomes its gRPC status with the same message; with
    a request id (the client's ``x-request-id`` metadata, else a new one) in its log lines and
    echoed in the response's initial metadata, and one access line when it ends (liveness and
    readiness at DEBUG, as HTTP health checks)."""
    route = f"/inference.GRPCInferenceService/{handler.__name__}"
    probe = handler.__name__ in ("ServerLive", "ServerReady")
    level = logging.DEBUG if probe else logging.INFO

    async def rpc(self: InferenceService, request: Any, context: grpc.aio.ServicerContext) -> Reply:
        start = time.perf_counter()
        pairs = context.invocation_metadata() or ()
        metadata = dict(pairs)
        record = access.begin(access.valid_id(metadata.get(access.HEADER)))
        spans = None if probe else self.state.spans
        span = spans.start_rpc(pairs, route) if spans is not None else None
        code = grpc.StatusCode.OK
        failure: BaseException | None = None
        try:
            await context.send_initial_metadata(((access.HEADER, record.request_id),))
            if self.state.draining and handler.__name__ not in _WHILE_DRAINING:
                raise ServiceError(
                    503, "draining", "the server is shutting down; send the call to another replica"
                )
            return await handler(self, request, context)
        except ServiceError as error:
            code, failure = status_code(error.canonical), error
            await context.abort(code, details(error.message))
        except ProtocolError as error:
            code, failure = status_code(canonical(error.status)), error
            await context.abort(code, details(str(error)))
        except Exception as error:
            code, failure = grpc.StatusCode.INTERNAL, error
            log.exception("unexpected error in gRPC %s", handler.__name__)
            await context.abort(code, "the server failed; see its log")
        except asyncio.CancelledError:  # the client cancelled or its deadline passed
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            if spans is not None and span is not None:
                spans.end_rpc(span, route, code.value[0], code.name, failure)
            seconds = time.perf_counter() - start
            metrics = self.state.metrics
            metrics.grpc_requests.labels(handler.__name__, code.name).inc()
            metrics.grpc_latency.labels(handler.__name__).observe(seconds)
            access.log_access("gRPC", route, code.name, record, seconds, level)
        raise AssertionError("context.abort returns only by raising")  # pragma: no cover

    rpc.__name__ = handler.__name__
    rpc.__doc__ = handler.__doc__
    return rpc


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` on the app's ``state``."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state
        self.repository = state.settings.model_repository is not None

    def _need_repository(self) -> None:
        if not self.repository:
            raise ServiceError(
                501,
                "unimplemented",
                "the model repository extension needs a repository (SMSO_MODEL_REPOSITORY)",
            )

    async def _not_offered(self, request: Any, context: Any) -> None:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, "this server does not offer this RPC (see docs/oip.md)"
        )

    # answered here rather than by the generated base class, which logs a traceback for each
    ModelStreamInfer = ModelConfig = ModelStatistics = TraceSetting = LogSettings = _not_offered
    SystemSharedMemoryStatus = SystemSharedMemoryRegister = _not_offered
    SystemSharedMemoryUnregister = CudaSharedMemoryStatus = _not_offered
    CudaSharedMemoryRegister = CudaSharedMemoryUnregister = _not_offered

    @_rpc
    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.ServerLiveResponse(live=True)

    @_rpc
    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.ServerReadyResponse(ready=oip.is_server_ready(self.state))

    @_rpc
    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.ServerMetadataResponse(**oip.describe_server(self.repository))

    @_rpc
    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        ready = oip.is_model_ready(self.state, request.name, request.version or None)
        return pb.ModelReadyResponse(ready=ready)

    @_rpc
    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        model = access.note_model(self.state.registry.lookup(request.name, request.version or None))
        return pb.ModelMetadataResponse(**oip.describe_model(model))

    @_rpc
    async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        state = self.state
        start = time.perf_counter()
        remaining = context.time_remaining()  # the client's gRPC deadline, if it set one
        name, version = request.model_name, request.model_version or None
        # the message counts against max_buffered_bytes with the REST bodies, from here (grpcio
        # has received it whole) to the answer: RESOURCE_EXHAUSTED when the server holds enough
        size = request.ByteSize()
        state.buffered.take(size)
        try:
            async with state.registry.using(name, version) as model:
                access.note_model(model)
                parsed = infer_request(request, state.settings.max_files, oip.offered(model))
                deadline = oip.request_deadline(state, parsed, start)
                if remaining is not None:
                    deadline = min(deadline, start + remaining)
                answer = await oip.run_inference(state, model, parsed, deadline, INFER_ROUTE)
        finally:
            state.buffered.give(size)
        return infer_response(model, request.id, answer)

    @_rpc
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._need_repository()
        entries = oip.index_entries(self.state)
        if request.ready:
            entries = [e for e in entries if e["state"] == "READY"]
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**e) for e in entries]
        )

    @_rpc
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._need_repository()
        await oip.served_repository(self.state).load(request.model_name)
        return pb.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:  # noqa: N802
        self._need_repository()
        await oip.served_repository(self.state).unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()


def _refusal_rpc(
    name: str,
) -> Callable[[InferenceService, ServiceError, grpc.aio.ServicerContext], Awaitable[Any]]:
    """An RPC named ``name`` that answers with the error it is given (as :func:`_rpc` answers
    any: its status, an access line, counted)."""

    async def refuse(_: InferenceService, error: ServiceError, context: Any) -> Any:
        raise error

    refuse.__name__ = name
    return _rpc(refuse)


class KeyFirst(grpc.aio.ServerInterceptor):
    """The API key, checked on a call's metadata before its message is read.

    A handler of a unary RPC gets its request message whole: grpcio reads it (up to
    ``max_receive_message_length``) before the handler runs, so a check inside the handler comes
    after the server has held the message. A call without the key is answered instead by a
    handler that takes its request as a stream and never reads it (the wire format of a unary
    and a client-streaming call is the same): UNAUTHENTICATED, logged and counted as any call.
    """

    def __init__(self, service: InferenceService) -> None:
        self.service = service

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        name = details.method.rpartition("/")[2]
        key = self.service.state.settings.api_key
        if key is None or name not in KEYED:
            return await continuation(details)
        metadata = {k.lower(): v for k, v in details.invocation_metadata or ()}
        sent, auth = metadata.get("x-api-key"), metadata.get("authorization")
        try:
            authorize(
                key,
                sent if isinstance(sent, str) else None,
                auth if isinstance(auth, str) else None,
                HOW,
            )
        except ServiceError as error:
            return grpc.stream_unary_rpc_method_handler(self._refusal(name, error))
        return await continuation(details)

    def _refusal(self, name: str, error: ServiceError) -> Callable[[Any, Any], Awaitable[Any]]:
        answer, service = _refusal_rpc(name), self.service

        async def behaviour(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            return await answer(service, error, context)

        return behaviour


class AdmitAndParse(grpc.aio.ServerInterceptor):
    """Each unary RPC holds a place among the requests in progress (the server's
    :class:`~service.limits.inflight.InFlight`, shared with HTTP; the probes and the server's
    metadata excepted), and its message is parsed by the handler, once its structure is known
    to be small (:func:`~service.grpc.wire.check_structure`: at most :data:`MAX_FIELDS` fields
    plus one per image allowed, counted on its bytes).

    A call beyond the limit is RESOURCE_EXHAUSTED, logged and counted as any call (grpcio's own
    ``maximum_concurrent_rpcs`` cancelled calls instead, uncounted). A message that does not
    parse is the client's error like any other: INVALID_ARGUMENT, one access line and counted
    (left to grpcio, it ends the call with UNKNOWN and an ERROR traceback in the log, seven
    lines a call, that any client could repeat at will)."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service
        #: each method's handler as grpcio gives it, and as wrapped here
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler
        known = self._wrapped.get(details.method)
        if known is None or known[0] is not handler:
            known = self._wrapped[details.method] = (handler, self._wrap(details.method, handler))
        return known[1]

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        name = method.rpartition("/")[2]
        parse, run, service = handler.request_deserializer, handler.unary_unary, self.service

        inflight = service.state.inflight if name in ADMITTED else None
        refusal = _refusal_rpc(name)
        kind = _REQUEST_TYPES.get(name)
        limit = MAX_FIELDS + service.state.settings.max_files

        async def behaviour(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            if inflight is not None:
                try:
                    inflight.take()
                except ServiceError as full:
                    return await refusal(service, full, context)
            try:
                try:
                    if kind is not None:
                        check_structure(raw, kind, limit)
                    request = parse(raw)
                except ProtocolError as error:
                    large = ServiceError(400, "too_many_fields", str(error))
                    return await refusal(service, large, context)
                except Exception:  # protobuf's DecodeError, or anything a parser may raise
                    malformed = ServiceError(400, "malformed", f"the {name} message does not parse")
                    return await refusal(service, malformed, context)
                return await run(request, context)
            finally:
                if inflight is not None:
                    inflight.give()

        return grpc.unary_unary_rpc_method_handler(
            behaviour, response_serializer=handler.response_serializer
        )


async def start_grpc_server(state: ServiceState) -> grpc.aio.Server:
    """The gRPC service on ``settings.host:settings.grpc_port``, started; ``OSError`` saying
    which address when it cannot listen. Stop it with ``await server.stop(grace)``."""
    settings = state.settings
    service = InferenceService(state)
    server = grpc.aio.server(
        interceptors=[KeyFirst(service), AdmitAndParse(service)],
        options=[
            # what --workers N needs to share the port (grpcio's default, stated)
            ("grpc.so_reuseport", 1),
            # one message is one request: the bound on a REST body bounds it too
            ("grpc.max_receive_message_length", settings.max_request_bytes),
            ("grpc.max_send_message_length", -1),
            # HTTP/2 streams open at once on one connection (grpc core's default: no bound). With
            # a bound, grpc core refuses a connection's new streams (REFUSED_STREAM: not
            # processed, safe to retry) while it holds more than that many, the ones its client
            # has reset but whose calls are not yet torn down included: a rapid-reset flood
            # (open, cancel, repeat) is refused on its own connection instead of filling the
            # queue of new calls below, where it cancelled other clients' calls. As many as the
            # requests in progress allowed: a connection's calls beyond those would be refused
            ("grpc.max_concurrent_streams", max(STREAMS_PER_CONNECTION, settings.max_connections)),
            # calls that have arrived but that no handler has taken up yet: past grpc core's
            # default (1,000) it cancels new ones, uncounted; the requests-in-progress limit,
            # which answers RESOURCE_EXHAUSTED and counts, is to come first
            ("grpc.server.max_pending_requests", max(1000, 4 * settings.max_connections)),
            (
                "grpc.server.max_pending_requests_hard_limit",
                max(3000, 8 * settings.max_connections),
            ),
        ],
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
    host = settings.host
    address = f"[{host}]:{settings.grpc_port}" if ":" in host else f"{host}:{settings.grpc_port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:  # grpcio >= 1.60 raises where it used to return 0
        bound = 0
    if not bound:
        await server.stop(None)
        raise OSError(
            f"cannot listen for gRPC on {address} (the port is taken or the host "
            "does not exist; --grpc-port 0 turns gRPC off)"
        )
    await server.start()
    return server
