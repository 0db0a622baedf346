"""Bodies of the Open Inference Protocol's ``infer`` (KServe v2, the protocol Triton speaks).

A request body is a JSON object, optionally followed by the binary tensor data extension's raw
tensors (the JSON's length in the ``Inference-Header-Content-Length`` header; each binary input
says its size in ``parameters.binary_data_size``). Binary tensors are little-endian and row
major; a ``BYTES`` element is a 4-byte little-endian length followed by that many bytes.

:func:`parse_request` turns a body into an :class:`InferRequest` of numpy arrays (``BYTES``:
lists of ``bytes``) and :func:`encode_response` writes the answer, JSON or binary per output.
The JSON header's structure is checked by strict pydantic models (:class:`RequestHeader`, also
the OpenAPI document's schema of the body); the binary framing (sizes, offsets, element counts,
byte order) stays written out here, where its bounds are checked.
Every problem raises :class:`ProtocolError` with a message that says what was expected.
The per-tensor steps (:func:`check_counts`, :func:`check_input`, :func:`binary_tensor`,
:func:`requested_outputs`, :func:`tensor_bytes`) serve the gRPC side too
(``service.grpc.server``): its raw tensor contents are in the same binary form.

A request's cost is bounded by its size with small constants: nothing is compared pairwise,
and a request that names more inputs or outputs than the model has (:class:`Offered`, given by
``service.protocol.semantics``) is refused before any of them is read. Names come from the
client: messages show them through :func:`quoted` and :func:`listed`, which keep them short.
Beyond those counts nothing here knows about the model: ``service.protocol.semantics`` checks
names, shapes and datatypes.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "DATATYPES",
    "HEADER_LENGTH",
    "InferRequest",
    "InputHeader",
    "InputTensor",
    "Offered",
    "OutputHeader",
    "OutputTensor",
    "ProtocolError",
    "RequestHeader",
    "RequestedOutput",
    "binary_tensor",
    "check_counts",
    "check_input",
    "decompress",
    "encode_response",
    "header_schema",
    "listed",
    "pack_bytes",
    "parse_request",
    "quoted",
    "requested_outputs",
    "tensor_bytes",
    "unpack_bytes",
]

HEADER_LENGTH = "Inference-Header-Content-Length"
#: More dimensions than any image model needs; bounds the cost of checking a shape.
MAX_RANK = 8
MAX_DIM = 2**31
#: numpy's bound on an array's elements of the largest datatype (its byte size must fit intp).
_MAX_ELEMENTS = np.iinfo(np.intp).max // 8
_END = object()
#: How much of a client's name a message shows, and how many names of a list.
NAME_CHARS = 64
LISTED_NAMES = 5

#: The protocol's datatypes and their numpy types (``BYTES``: Python ``bytes`` elements).
DATATYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": object,
}


class ProtocolError(ValueError):
    """A request the protocol (or this server) cannot accept; ``status`` is its HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def quoted(value: Any) -> str:
    """``value`` as ``repr`` shows it, a string cut to its first :data:`NAME_CHARS` characters
    and its length: names come from the client, and a message echoes them."""
    if isinstance(value, str) and len(value) > NAME_CHARS:
        return f"{value[:NAME_CHARS]!r}... ({len(value):,} characters)"
    text = repr(value)
    return text if len(text) <= NAME_CHARS else f"{text[:NAME_CHARS]}..."


def listed(names: Sequence[str]) -> str:
    """The first :data:`LISTED_NAMES` names, :func:`quoted`, and how many more there are."""
    shown = ", ".join(quoted(name) for name in names[:LISTED_NAMES])
    more = len(names) - LISTED_NAMES
    return f"{shown} and {more:,} more" if more > 0 else shown


@dataclass(frozen=True)
class Offered:
    """The tensors a model has, by name: a request names at most as many inputs, and asks for
    at most as many outputs (each at most once)."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def check_counts(inputs: int, outputs: int, offered: Offered | None) -> None:
    """400 when a request has more inputs or asks for more outputs than the model has
    (``None``: no model to count against); checked before any tensor is read."""
    if offered is None:
        return
    if inputs > len(offered.inputs):
        raise ProtocolError(
            f"the request has {inputs:,} inputs; the model has {len(offered.inputs)} "
            f"({', '.join(offered.inputs)})"
        )
    if outputs > len(offered.outputs):
        raise ProtocolError(
            f"the request names {outputs:,} outputs; the model has {len(offered.outputs)} "
            f"({', '.join(offered.outputs)}): ask for each at most once, or for none (all)"
        )


class _Header(BaseModel):
    """The JSON header's structure, checked strictly (no type coercion); values that need a
    precise message (datatypes, shapes, sizes, flags) are checked where they are used."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class InputHeader(_Header):
    """One entry of ``inputs``: ``data`` (JSON tensors) or ``parameters.binary_data_size``."""

    name: str
    # checked in _inputs, for a message that lists the choices; the schema documents them
    datatype: Any = Field(None, json_schema_extra={"type": "string", "enum": [*sorted(DATATYPES)]})
    shape: Any = Field(
        None,
        json_schema_extra={
            "type": "array",
            "maxItems": MAX_RANK,
            "items": {"type": "integer", "minimum": 0, "maximum": MAX_DIM - 1},
        },
    )
    parameters: dict[str, Any] | None = None
    data: Any = None


class OutputHeader(_Header):
    """One entry of ``outputs``: ``parameters`` may ask for ``binary_data`` and
    ``classification`` (top k)."""

    name: str
    parameters: dict[str, Any] | None = None


class RequestHeader(_Header):
    """An ``infer`` request's JSON header."""

    id: str | None = None
    inputs: list[InputHeader] = Field(min_length=1)
    outputs: list[OutputHeader] | None = None
    parameters: dict[str, Any] | None = None


def header_schema() -> dict[str, Any]:
    """:class:`RequestHeader`'s JSON Schema with its definitions inlined (for the OpenAPI
    document, which has no ``$defs`` of its own)."""
    schema = RequestHeader.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return inline(definitions[ref.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    return inline(schema)


def _header_error(error: ValidationError) -> ProtocolError:
    """The first problem of a header as one sentence that says what was expected."""
    first = error.errors()[0]
    loc = first["loc"]
    if not loc:
        return ProtocolError("the request must be a JSON object with 'inputs'")
    field, index = loc[0], loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    if loc[-1] == "parameters":
        where = "the request" if len(loc) == 1 else f"{field}[{index}]"
        return ProtocolError(f"{where}: 'parameters' must be an object")
    if field == "id":
        return ProtocolError("'id' must be a string")
    if field == "inputs" and index is None:
        return ProtocolError("the request needs a non-empty 'inputs' list")
    if field == "outputs" and index is None:
        return ProtocolError("'outputs' must be a list")
    return ProtocolError(f"{field}[{index}] must be an object with a 'name'")


@dataclass(frozen=True)
class InputTensor:
    """One input: numeric ``data`` is a numpy array of ``shape``; ``BYTES`` a list of bytes."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | list[bytes]
    binary: bool


@dataclass(frozen=True)
class RequestedOutput:
    """An output the client asked for: as binary data or JSON, and top-``classification``."""

    name: str
    binary: bool
    classification: int = 0


@dataclass(frozen=True)
class InferRequest:
    id: str | None
    inputs: list[InputTensor]
    #: None: every output, binary when the request's ``binary_data_output`` is true
    outputs: list[RequestedOutput] | None
    binary_output: bool
    parameters: dict[str, Any]


@dataclass(frozen=True)
class OutputTensor:
    """One output: numeric ``data`` or, for ``BYTES``, a list of bytes (row major)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | list[bytes]
    binary: bool


def decompress(body: bytes | bytearray, encoding: str | None, limit: int) -> bytes | bytearray:
    """The body under its ``Content-Encoding`` (``gzip`` or ``deflate``: tritonclient's
    compression options), refused once it inflates beyond ``limit`` bytes."""
    if not encoding or encoding == "identity":
        return body
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(encoding.lower())
    if wbits is None:
        raise ProtocolError(
            f"Content-Encoding {quoted(encoding)} is not supported; use gzip, deflate or none", 415
        )
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as error:
        raise ProtocolError(f"the body is not valid {encoding} data: {error}") from None
    if len(out) > limit:
        raise ProtocolError(f"the decompressed request body is larger than {limit:,} bytes", 413)
    if not inflater.eof or inflater.unused_data:
        raise ProtocolError(
            f"the body is not one complete {encoding} stream (truncated or followed by other bytes)"
        )
    return out


def pack_bytes(items: list[bytes]) -> bytes:
    """``BYTES`` elements in the binary format: ``<uint32 length><bytes>`` each."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def unpack_bytes(buffer: bytes | memoryview, count: int, name: str) -> list[bytes]:
    """``count`` length-prefixed elements that fill ``buffer`` exactly."""
    items, offset = [], 0
    for i in range(count):
        if offset + 4 > len(buffer):
            raise ProtocolError(f"input {quoted(name)}: binary BYTES data ends before element {i}")
        (size,) = struct.unpack_from("<I", buffer, offset)
        offset += 4
        if offset + size > len(buffer):
            raise ProtocolError(
                f"input {quoted(name)}: element {i} says {size} bytes but only "
                f"{len(buffer) - offset} remain"
            )
        items.append(bytes(buffer[offset : offset + size]))
        offset += size
    if offset != len(buffer):
        raise ProtocolError(
            f"input {quoted(name)}: {len(buffer) - offset} bytes left after {count} BYTES elements "
            "(shape and data disagree)"
        )
    return items


def _flatten(data: Any, rank: int, name: str) -> list[Any]:
    """Row-major elements of a flat or nested JSON list, nested at most ``rank`` deep."""
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    stack = [(iter(data), 1)]
    while stack:
        items, depth = stack[-1]
        item = next(items, _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, list):
            if depth >= max(rank, 1):
                raise ProtocolError(f"input {quoted(name)}: 'data' is nested deeper than its shape")
            stack.append((iter(item), depth + 1))
        else:
            out.append(item)
    return out


def _shape(raw: Any, name: str) -> tuple[int, ...]:
    if (
        not isinstance(raw, list)
        or len(raw) > MAX_RANK
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < MAX_DIM for d in raw)
    ):
        raise ProtocolError(
            f"input {quoted(name)}: shape must be a list of at most {MAX_RANK} integers in "
            f"[0, {MAX_DIM})"
        )
    # numpy refuses an array whose non-zero dimensions multiply past its index range, even
    # when another dimension is 0 and it holds nothing ([0, 3, 2**31 - 1, 2**31 - 1])
    if math.prod(d for d in raw if d) > _MAX_ELEMENTS:
        raise ProtocolError(
            f"input {quoted(name)}: shape {raw} describes more elements than an array holds"
        )
    return tuple(raw)


def _is_number(value: Any, datatype: str) -> bool:
    if datatype == "BOOL":
        return isinstance(value, bool)
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json_data(raw: InputHeader, name: str, datatype: str, shape: tuple[int, ...]) -> Any:
    if "data" not in raw.model_fields_set:
        raise ProtocolError(
            f"input {quoted(name)} has neither 'data' nor parameters.binary_data_size"
        )
    if raw.data is None:
        raise ProtocolError(
            f"input {quoted(name)}: 'data' is null; give the tensor's elements as a JSON list, "
            "or its bytes as binary data (parameters.binary_data_size)"
        )
    elements = _flatten(raw.data, len(shape), name)
    count = math.prod(shape)
    if len(elements) != count:
        raise ProtocolError(
            f"input {quoted(name)}: shape {list(shape)} needs {count} elements, 'data' has "
            f"{len(elements)}"
        )
    if datatype == "BYTES":
        if not all(isinstance(e, str) for e in elements):
            raise ProtocolError(f"input {quoted(name)}: BYTES data in JSON must be strings")
        try:
            return [e.encode() for e in elements]
        except UnicodeEncodeError:
            raise ProtocolError(
                f"input {quoted(name)}: a BYTES string is not valid UTF-8"
            ) from None
    if not all(_is_number(e, datatype) for e in elements):
        kind = "true or false" if datatype == "BOOL" else "numbers"
        raise ProtocolError(f"input {quoted(name)}: {datatype} 'data' must be JSON {kind}")
    try:  # a float out of its datatype's range (1e300 as FP16) is refused, not made inf
        with np.errstate(over="raise", invalid="raise"):
            return np.asarray(elements, dtype=DATATYPES[datatype]).reshape(shape)
    except (TypeError, ValueError, OverflowError, FloatingPointError):
        raise ProtocolError(f"input {quoted(name)}: 'data' does not fit {datatype}") from None


def binary_tensor(
    buffer: bytes | memoryview, name: str, datatype: str, shape: tuple[int, ...]
) -> Any:
    """Input ``name``'s elements from its binary form (the binary extension's data, gRPC's
    ``raw_input_contents``): an array of ``shape`` or, for ``BYTES``, a list of bytes."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return unpack_bytes(buffer, count, name)
    dtype = np.dtype(DATATYPES[datatype]).newbyteorder("<")
    if len(buffer) != count * dtype.itemsize:
        raise ProtocolError(
            f"input {quoted(name)}: shape {list(shape)} of {datatype} is {count * dtype.itemsize} "
            f"bytes, binary_data_size says {len(buffer)}"
        )
    return np.frombuffer(buffer, dtype).astype(dtype.newbyteorder("="), copy=False).reshape(shape)


def _not_json(error: ValueError, header_length: int | None) -> str:
    """What is wrong with a request that ``json.loads`` refused, said for a client."""
    if isinstance(error, json.JSONDecodeError):
        # data after the JSON is what binary tensors sent without the header look like
        extra = error.msg == "Extra data" and header_length is None
        hint = f" (binary tensors need the {HEADER_LENGTH} header)" if extra else ""
        return f"the request is not valid JSON: {error}{hint}"
    if isinstance(error, UnicodeDecodeError):
        return f"the request's JSON is not UTF-8: {error.reason} at byte {error.start}"
    if "digits" in str(error):  # Python's limit on int() of long digit strings
        return "a number in the request's JSON has more than 4,300 digits"
    return f"the request is not valid JSON: {error}"


def _header(
    body: bytes | bytearray, header_length: int | None, max_json_bytes: int, offered: Offered | None
) -> tuple[RequestHeader, memoryview]:
    if header_length is not None and not 0 < header_length <= len(body):
        raise ProtocolError(f"{HEADER_LENGTH} is {header_length} but the body is {len(body)} bytes")
    end = len(body) if header_length is None else header_length
    if end > max_json_bytes:
        raise ProtocolError(
            f"the JSON part of the request is {end:,} bytes, more than {max_json_bytes:,}; send "
            "large tensors as binary data (binary_data_size)",
            413,
        )
    try:
        header = json.loads(body[:end])
    except RecursionError:
        raise ProtocolError("the request's JSON is nested too deeply") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, int()'s digit limit
        raise ProtocolError(_not_json(error, header_length)) from None
    if isinstance(header, dict):  # counted before pydantic builds a model of each tensor
        inputs, outputs = header.get("inputs"), header.get("outputs")
        check_counts(
            len(inputs) if isinstance(inputs, list) else 0,
            len(outputs) if isinstance(outputs, list) else 0,
            offered,
        )
    try:
        parsed = RequestHeader.model_validate(header)
    except ValidationError as error:
        raise _header_error(error) from None
    return parsed, memoryview(body)[end:]


def _flag(parameters: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = parameters.get(key, default)
    if not isinstance(value, bool):
        raise ProtocolError(f"{where}: {key} must be true or false, got {quoted(value)}")
    return value


def check_input(
    name: str, datatype: Any, shape: Any, parameters: dict[str, Any], max_elements: int | None
) -> tuple[int, ...]:
    """An input's datatype, shape and parameters checked (at most ``max_elements`` ``BYTES``
    elements, 413 beyond; None: no limit); its shape."""
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise ProtocolError(
            f"input {quoted(name)}: datatype {quoted(datatype)} is not one of {sorted(DATATYPES)}"
        )
    checked = _shape(shape, name)
    if "shared_memory_region" in parameters:
        raise ProtocolError("the shared-memory extension is not supported; send the data")
    if datatype == "BYTES" and max_elements is not None and math.prod(checked) > max_elements:
        raise ProtocolError(
            f"input {quoted(name)} has {math.prod(checked)} BYTES elements; at most {max_elements} "
            "per request",
            413,
        )
    return checked


def _inputs(header: RequestHeader, binary: memoryview, max_elements: int) -> list[InputTensor]:
    for raw in header.inputs:  # every input well-formed (else 400) before any is too large (413)
        check_input(raw.name, raw.datatype, raw.shape, raw.parameters or {}, None)
    inputs, offset = [], 0
    for raw in header.inputs:
        name = raw.name
        datatype = raw.datatype
        parameters = raw.parameters or {}
        shape = check_input(name, datatype, raw.shape, parameters, max_elements)
        size = parameters.get("binary_data_size")
        if size is None:
            data = _json_data(raw, name, datatype, shape)
        else:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ProtocolError(
                    f"input {quoted(name)}: binary_data_size must be a number of bytes (an "
                    f"integer, 0 or more), got {str(size)[:40]!r}"
                )
            if offset + size > len(binary):
                raise ProtocolError(
                    f"input {quoted(name)}: binary_data_size {size:,} does not fit the "
                    f"{len(binary) - offset} binary bytes left in the body"
                )
            # a view of the body, not a copy: a 57 MB tensor costs its body once
            data = binary_tensor(binary[offset : offset + size], name, datatype, shape)
            offset += size
        inputs.append(InputTensor(name, datatype, shape, data, size is not None))
    if offset != len(binary):
        raise ProtocolError(
            f"{len(binary) - offset} bytes after the JSON header belong to no input "
            "(check binary_data_size)"
        )
    return inputs


def _outputs(header: RequestHeader, binary_default: bool) -> list[RequestedOutput] | None:
    """The requested outputs; each is binary as its ``binary_data`` says, else as the request's
    ``binary_data_output`` says."""
    if header.outputs is None:
        return None
    entries = ((raw.name, raw.parameters or {}) for raw in header.outputs)
    return requested_outputs(entries, binary_default)


def requested_outputs(
    entries: Iterable[tuple[str, dict[str, Any]]], binary_default: bool
) -> list[RequestedOutput]:
    """The requested outputs from their names and ``parameters`` (``classification``,
    ``binary_data``), in order; an output asked for twice is refused (one set of the names
    seen: linear in their number)."""
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for name, parameters in entries:
        if "shared_memory_region" in parameters:
            raise ProtocolError("the shared-memory extension is not supported")
        k = parameters.get("classification", 0)
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ProtocolError(
                f"output {quoted(name)}: classification must be a non-negative integer"
            )
        if name in seen:
            raise ProtocolError(f"output {quoted(name)} is requested twice")
        seen.add(name)
        binary = _flag(parameters, "binary_data", binary_default, f"output {quoted(name)}")
        outputs.append(RequestedOutput(name, binary, k))
    return outputs


def parse_request(
    body: bytes | bytearray,
    header_length: int | None,
    max_json_bytes: int = 4 * 2**20,
    max_elements: int = 1024,
    offered: Offered | None = None,
) -> InferRequest:
    """An inference request from its body (JSON, or JSON + binary tensors).

    The JSON part may be at most ``max_json_bytes`` (413 beyond: parsing JSON holds the
    interpreter), a ``BYTES`` tensor at most ``max_elements`` elements, and the request names
    at most as many inputs and outputs as ``offered`` (checked first; None: no model's bound).
    """
    header, binary = _header(body, header_length, max_json_bytes, offered)
    parameters = header.parameters or {}
    binary_output = _flag(parameters, "binary_data_output", False, "the request")
    return InferRequest(
        id=header.id,
        inputs=_inputs(header, binary, max_elements),
        outputs=_outputs(header, binary_output),
        binary_output=binary_output,
        parameters=parameters,
    )


def tensor_bytes(output: OutputTensor) -> bytes:
    """An output in the binary form: little-endian, row major; ``BYTES`` length-prefixed."""
    if output.datatype == "BYTES":
        return pack_bytes(output.data)  # type: ignore[arg-type]
    array = np.ascontiguousarray(output.data, DATATYPES[output.datatype])
    return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def encode_response(
    model_name: str, model_version: str, request_id: str | None, outputs: list[OutputTensor]
) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, the JSON header's length."""
    header: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        header["id"] = request_id
    entries, chunks = [], []
    for output in outputs:
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(output.shape),
        }
        if output.binary:
            chunk = tensor_bytes(output)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        elif output.datatype == "BYTES":
            entry["data"] = [item.decode() for item in output.data]
        else:
            entry["data"] = np.asarray(output.data).reshape(-1).tolist()
        entries.append(entry)
    header["outputs"] = entries
    text = json.dumps(header, separators=(",", ":")).encode()
    if not chunks:
        return text, None
    return b"".join([text, *chunks]), len(text)
