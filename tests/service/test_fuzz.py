"""Property-based fuzzing of the two parsers that read client bytes: the image decoder
and the Open Inference Protocol codec. Whatever the bytes, the decoder returns the model's input
or raises an :class:`ImageError` (or :class:`ImageTooLargeError`, the 413), and the protocol
parser returns a request or raises a :class:`ProtocolError`: never another exception (a 500).

Every test is bounded (``max_examples``) and derandomised, so CI runs the same examples in a few
seconds each; ``SMSO_FUZZ_SCALE=20`` runs twenty times as many examples.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import struct
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("hypothesis", reason="the fuzz tests need hypothesis (dev extra)")
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from service.core.card import Preprocessing
from service.imaging.gpu_jpeg import GpuJpegPreprocessor
from service.imaging.images import FORMATS, ImageError, ImageTooLargeError, Preprocess, Preprocessor
from service.protocol.codec import (
    DATATYPES,
    InferRequest,
    ProtocolError,
    decompress,
    pack_bytes,
    parse_request,
)

from .conftest import CARD


def examples(n: int) -> int:
    """``n`` times ``SMSO_FUZZ_SCALE`` (default 1): set it for a longer hunt than CI's."""
    return max(1, round(n * float(os.environ.get("SMSO_FUZZ_SCALE", "1"))))


# Reproducible in CI: the same examples on every run, no example database written.
BOUNDED = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# The fake card's grey preprocessing and an RGB one that enlarges (resize > crop > the images).
SPECS = {
    "grey": Preprocessing(**CARD["preprocessing"]),
    "rgb": Preprocessing(colour="RGB", resize=40, crop=32, mean=[0.5] * 3, std=[0.25] * 3),
}
# Small enough that a mutated header claiming a large image is refused before decoding.
MAX_PIXELS = 1 << 20

Image.init()  # every plugin registered, as the decoder has them
ACCEPTED = [name for name in FORMATS if name in Image.OPEN]


def _pixels(mode: str, width: int = 24, height: int = 17) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 10, y * 14, (x + y) * 6], axis=-1).astype(np.uint8)  # (H, W, 3)
    image = Image.fromarray(rgb)
    return image.convert(mode) if mode != "P" else image.convert("P", palette=Image.Palette.WEB)


def _floats(finite: bool = False) -> np.ndarray:
    """(17, 24) float32 of both signs, with NaN and infinities unless ``finite``."""
    values = np.linspace(-300.0, 3e4, 17 * 24, dtype=np.float32).reshape(17, 24)
    if not finite:
        values[0, :3] = [np.nan, np.inf, -np.inf]
    return values


def _encode(image: Image.Image, fmt: str, **options: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    return buf.getvalue()


def _seeds() -> dict[str, list[bytes]]:
    """Small valid files in each accepted format, in the modes and options each format takes."""
    seeds = {
        "JPEG": [
            _encode(_pixels("RGB"), "JPEG"),
            _encode(_pixels("L"), "JPEG", progressive=True),
            _encode(_pixels("CMYK"), "JPEG"),
        ],
        "PNG": [
            _encode(_pixels("RGB"), "PNG"),
            _encode(_pixels("P"), "PNG"),
            _encode(_pixels("LA"), "PNG"),
            _encode(_pixels("L"), "PNG", optimize=True),
            _encode(Image.fromarray(np.asarray(_pixels("L"), np.uint16) * 257), "PNG"),
        ],
        "WEBP": [_encode(_pixels("RGB"), "WEBP"), _encode(_pixels("RGBA"), "WEBP", lossless=True)],
        "GIF": [
            _encode(_pixels("P"), "GIF"),
            _encode(
                _pixels("P"),
                "GIF",
                save_all=True,
                append_images=[_pixels("L").convert("P")],
                duration=50,
            ),
        ],
        "BMP": [
            _encode(_pixels("RGB"), "BMP"),
            _encode(_pixels("P"), "BMP"),
            _encode(_pixels("1"), "BMP"),
        ],
        "TIFF": [
            _encode(_pixels("RGB"), "TIFF"),
            _encode(_pixels("CMYK"), "TIFF"),
            _encode(_pixels("RGB"), "TIFF", compression="tiff_lzw"),
            _encode(Image.fromarray(np.asarray(_pixels("L"), np.uint16) * 257), "TIFF"),
            _encode(Image.fromarray(_floats()), "TIFF"),
            _encode(Image.fromarray((_floats(finite=True) * 1e4).astype(np.int32)), "TIFF"),
        ],
    }
    return {name: files for name, files in seeds.items() if name in ACCEPTED}


SEEDS = _seeds()


def _mutate(data: bytes, edits: list[tuple[str, int, bytes]]) -> bytes:
    """Apply byte edits; each position is taken modulo the current length."""
    out = bytearray(data)
    for kind, position, payload in edits:
        at = position % (len(out) + 1)
        if kind == "flip" and at < len(out):
            out[at] ^= payload[0] if payload else 0xFF
        elif kind == "overwrite":
            out[at : at + len(payload)] = payload
        elif kind == "insert":
            out[at:at] = payload
        elif kind == "delete":
            del out[at : at + 1 + len(payload)]
        elif kind == "truncate":
            del out[at:]
    return bytes(out)


EDITS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "overwrite", "insert", "delete", "truncate"]),
        st.integers(0, 1 << 16),
        st.binary(min_size=0, max_size=8)
        | st.sampled_from([b"\xff", b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff"]),
    ),
    min_size=1,
    max_size=6,
)


def _check_decodes_or_refuses(
    spec_name: str, data: bytes, preprocessor: Preprocess | None = None
) -> None:
    preprocessor = preprocessor or Preprocessor(SPECS[spec_name], MAX_PIXELS)
    try:
        out = preprocessor(data, "x")
    except (ImageError, ImageTooLargeError) as error:
        refused: Exception | None = error
    else:
        refused = None
    if refused is not None:
        assert str(refused).startswith("x: ")  # names the file
        event(f"refused: {type(refused).__name__}")
        return
    event("decoded")
    spec = SPECS[spec_name]
    assert out.dtype == np.float32
    assert out.shape == (len(spec.mean), spec.crop, spec.crop)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("fmt", ACCEPTED)
@settings(BOUNDED, max_examples=examples(500))
@given(data=st.data(), spec_name=st.sampled_from(sorted(SPECS)), edits=EDITS)
def test_mutated_images_decode_or_raise_an_image_error(fmt, data, spec_name, edits):
    seed = data.draw(st.sampled_from(SEEDS[fmt]), label="seed")
    mutated = _mutate(seed, edits)
    if fmt == "PNG" and data.draw(st.booleans(), label="fix CRCs"):
        mutated = _fix_png_crcs(mutated)  # else most edits only reach the checksum test
    _check_decodes_or_refuses(spec_name, mutated)


GPU_PATHS = {  # decode_device=cuda's code, on nvImageCodec's CPU decoder here
    name: GpuJpegPreprocessor(
        Preprocessor(spec, MAX_PIXELS), "cpu", on_decoded=lambda where: event(f"path: {where}")
    )
    for name, spec in SPECS.items()
}


@settings(BOUNDED, max_examples=examples(400))
@given(data=st.data(), spec_name=st.sampled_from(sorted(SPECS)), edits=EDITS)
def test_mutated_jpegs_on_the_gpu_path_decode_or_raise_an_image_error(data, spec_name, edits):
    """The GPU decoding's routing and its decoder see the mutated JPEG first, Pillow whatever
    they pass on."""
    seed = data.draw(st.sampled_from(SEEDS["JPEG"]), label="seed")
    if data.draw(st.booleans(), label="keep the end marker"):  # else most go to Pillow
        mutated = _mutate(seed[:-2], edits) + seed[-2:]
    else:
        mutated = _mutate(seed, edits)
    _check_decodes_or_refuses(spec_name, mutated, GPU_PATHS[spec_name])


def _fix_png_crcs(data: bytes) -> bytes:
    """Recompute the CRC of every chunk whose length still fits the file."""
    out, at = bytearray(data), 8
    while at + 12 <= len(out):
        (size,) = struct.unpack_from(">I", out, at)
        end = at + 8 + size
        if end + 4 > len(out):
            break
        out[end : end + 4] = struct.pack(">I", zlib.crc32(out[at + 4 : end]))
        at = end + 4
    return bytes(out)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


DIMENSION = st.integers(0, 2**32 - 1) | st.integers(0, 300) | st.sampled_from([1, 2**31, 2**31 - 1])


@settings(BOUNDED, max_examples=examples(600))
@given(
    width=DIMENSION,
    height=DIMENSION,
    depth=st.sampled_from([1, 2, 4, 8, 16, 0, 3, 32, 255]),
    colour=st.sampled_from([0, 2, 3, 4, 6, 1, 5, 7, 255]),
    interlace=st.sampled_from([0, 1, 2]),
    seed=st.integers(0, 9),
    spec_name=st.sampled_from(sorted(SPECS)),
)
def test_png_header_fields_with_valid_crcs_decode_or_raise(
    width, height, depth, colour, interlace, seed, spec_name
):
    """IHDR rewritten (and its CRC recomputed, so the plugin's checksum does not hide the field):
    sizes that disagree with the pixel data, bit depths and colour types that do not go together."""
    original = SEEDS["PNG"][seed % len(SEEDS["PNG"])]
    assert original[12:16] == b"IHDR"
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace)
    data = original[:8] + _chunk(b"IHDR", ihdr) + original[8 + 25 :]
    _check_decodes_or_refuses(spec_name, data)


def _set(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    return data[:offset] + struct.pack(fmt, value) + data[offset + struct.calcsize(fmt) :]


def _header_variants(fmt: str, data: bytes, width: int, height: int) -> bytes:
    """The size fields of each format's header set to ``width`` x ``height`` (wrapped to the
    field's width), the rest of the file unchanged."""
    if fmt == "GIF":  # logical screen, then the first image descriptor
        data = _set(data, 6, "<H", width & 0xFFFF)
        data = _set(data, 8, "<H", height & 0xFFFF)
        at = data.find(b"\x2c", 13)
        if at > 0:
            data = _set(data, at + 5, "<H", width & 0xFFFF)
            data = _set(data, at + 7, "<H", height & 0xFFFF)
        return data
    if fmt == "BMP":  # BITMAPINFOHEADER: signed 32-bit, a negative height is top-down
        data = _set(data, 18, "<i", (width & 0xFFFFFFFF) - (1 << 32 if width & (1 << 31) else 0))
        return _set(data, 22, "<i", (height & 0xFFFFFFFF) - (1 << 32 if height & (1 << 31) else 0))
    if fmt == "JPEG":  # the first start-of-frame marker
        at = min((i for i in (data.find(b"\xff\xc0"), data.find(b"\xff\xc2")) if i > 0), default=-1)
        if at > 0:
            data = _set(data, at + 5, ">H", height & 0xFFFF)
            data = _set(data, at + 7, ">H", width & 0xFFFF)
        return data
    if fmt == "WEBP":  # VP8X canvas (24-bit, minus one) or VP8L's packed 14-bit sizes
        if data[12:16] == b"VP8L":
            bits = ((width - 1) & 0x3FFF) | (((height - 1) & 0x3FFF) << 14)
            return data[:21] + struct.pack("<I", bits | (data[24] >> 4 << 28))[:4] + data[25:]
        if data[12:16] == b"VP8 ":
            return _set(_set(data, 26, "<H", width & 0x3FFF), 28, "<H", height & 0x3FFF)
        return data
    if fmt == "TIFF":  # ImageWidth (256) and ImageLength (257) entries of the first IFD
        order = "<" if data[:2] == b"II" else ">"
        (ifd,) = struct.unpack_from(order + "I", data, 4)
        (count,) = struct.unpack_from(order + "H", data, ifd)
        for k in range(count):
            entry = ifd + 2 + 12 * k
            tag, kind = struct.unpack_from(order + "HH", data, entry)
            if tag in (256, 257):
                value = width if tag == 256 else height
                if kind == 3:  # SHORT
                    data = _set(data, entry + 8, order + "H", value & 0xFFFF)
                else:
                    data = _set(data, entry + 4, order + "I", 1)
                    data = _set(data, entry + 8, order + "I", value & 0xFFFFFFFF)
        return data
    raise AssertionError(f"no header mutation for {fmt}")


@pytest.mark.parametrize("fmt", [name for name in ACCEPTED if name != "PNG"])
@settings(BOUNDED, max_examples=examples(200))
@given(width=DIMENSION, height=DIMENSION, seed=st.integers(0, 9), spec_name=st.just("rgb"))
def test_other_formats_header_sizes_decode_or_raise(fmt, width, height, seed, spec_name):
    original = SEEDS[fmt][seed % len(SEEDS[fmt])]
    _check_decodes_or_refuses(spec_name, _header_variants(fmt, original, width, height))


# --- The Open Inference Protocol parser ------------------------------------------------------

JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
NAME = st.sampled_from(["image", "logits", "embedding"]) | st.text(max_size=6)
ODD_DATATYPE = st.sampled_from(["fp32", "FP8", "", "STRING"])
ODD_DIMENSION = st.sampled_from([-1, 2**31 - 1, 2**31, 2**63, True, 1.0])
# Elements per datatype: in range, out of range, and of the wrong JSON type.
ELEMENTS = {
    "BOOL": st.booleans(),
    "BYTES": st.text(max_size=4),
    **{
        name: st.integers(int(np.iinfo(DATATYPES[name]).min), int(np.iinfo(DATATYPES[name]).max))
        for name in DATATYPES
        if name[0] in "UI"
    },
    **{name: st.floats(width=16 if name == "FP16" else 32) for name in ("FP16", "FP32", "FP64")},
}
STRAY_ELEMENT = (
    st.integers(-(2**70), 2**70) | st.floats() | st.booleans() | st.text(max_size=3) | st.none()
)


def _nest(values: list[Any], shape: list[int]) -> Any:
    """``values`` as a nested list of ``shape`` (row major), as JSON clients may send them."""
    if len(shape) <= 1:
        return values
    step = len(values) // shape[0] if shape[0] else 0
    return [_nest(values[k * step : (k + 1) * step], shape[1:]) for k in range(shape[0])]


@st.composite
def tensors(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    """An input as a client would write it (JSON data, nested or flat, or binary data and its
    size), then zero or more of its fields replaced by something of the wrong type or value."""
    datatype = draw(st.sampled_from(sorted(DATATYPES)))
    shape = draw(st.lists(st.integers(0, 3), max_size=4))
    count = math.prod(shape)
    element = ELEMENTS[datatype] | STRAY_ELEMENT if draw(st.booleans()) else ELEMENTS[datatype]
    values = draw(st.lists(element, min_size=count, max_size=count + draw(st.integers(0, 1))))
    raw: dict[str, Any] = {"name": draw(NAME), "datatype": datatype, "shape": shape}
    chunk = b""
    if draw(st.booleans()):  # binary tensor data extension
        if datatype == "BYTES":
            chunk = pack_bytes([str(v).encode() for v in values])
        else:
            numbers = [v if isinstance(v, int | float) else 0 for v in values]
            little = np.dtype(DATATYPES[datatype]).newbyteorder("<")
            try:
                with np.errstate(all="raise"):
                    chunk = np.asarray(numbers, little).tobytes()
            except (OverflowError, FloatingPointError, ValueError):  # NaN as an integer
                chunk = draw(st.binary(max_size=16))
        raw["parameters"] = {
            "binary_data_size": len(chunk) + draw(st.sampled_from([0, 0, 0, -1, 1]))
        }
    else:
        raw["data"] = _nest(values, shape) if draw(st.booleans()) else values
    for key in draw(
        st.lists(st.sampled_from(["name", "datatype", "shape", "data", "parameters"]), max_size=2)
    ):
        replacement = {
            "datatype": ODD_DATATYPE | JUNK,
            "shape": st.lists(st.integers(0, 4) | ODD_DIMENSION, max_size=9) | JUNK,
            "parameters": st.fixed_dictionaries(
                {},
                optional={
                    "binary_data_size": st.integers(-2, 64) | JUNK,
                    "shared_memory_region": JUNK,
                    "other": JUNK,
                },
            )
            | JUNK,
        }.get(key, JUNK)
        if draw(st.booleans()):
            raw[key] = draw(replacement)
        else:
            raw.pop(key, None)
    return raw, chunk


OUTPUT = (
    st.fixed_dictionaries(
        {"name": NAME},
        optional={
            "parameters": st.fixed_dictionaries(
                {},
                optional={
                    "binary_data": st.booleans() | JUNK,
                    "classification": st.integers(-2, 5) | JUNK,
                    "shared_memory_region": JUNK,
                },
            )
            | JUNK,
        },
    )
    | JUNK
)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, int | None]:
    """A protocol-like request (now and then any JSON value), its binary tensors after it, and
    the Inference-Header-Content-Length value: right, absent, or any other integer."""
    inputs = draw(st.lists(tensors(), min_size=1, max_size=3), label="inputs")
    header: Any = {"inputs": [raw for raw, _ in inputs]}
    optional = {
        "id": st.text(max_size=6) | JUNK,
        "outputs": st.lists(OUTPUT, max_size=3) | JUNK,
        "parameters": st.fixed_dictionaries(
            {}, optional={"binary_data_output": st.booleans() | JUNK, "timeout": JUNK}
        )
        | JUNK,
        "inputs": st.lists(JUNK, max_size=2) | JUNK,
    }
    for key in draw(st.lists(st.sampled_from(sorted(optional)), unique=True, max_size=3)):
        header[key] = draw(optional[key])
    if draw(st.sampled_from([False] * 9 + [True])):
        header = draw(JUNK)
    text = json.dumps(header).encode()  # NaN and Infinity included, as Python's json accepts
    binary = b"".join(chunk for _, chunk in inputs)
    binary += draw(st.sampled_from([b""] * 3 + [b"\x00", b"junk"]))
    body = text + binary
    right = len(text) if binary else None  # what a client sends
    length = draw(
        st.sampled_from([right] * 8 + [len(text), None, len(body), 0, -1, len(body) + 1, "any"]),
        label="header_length",
    )
    if length == "any":
        length = draw(st.integers(-2, len(body) + 2))
    assert not isinstance(length, str)  # "any" was drawn as an integer just above
    return body, length


def _check_request(request: InferRequest) -> None:
    """What a parsed request promises to ``service.http.oip``: data that matches its shape."""
    assert request.id is None or isinstance(request.id, str)
    assert isinstance(request.parameters, dict)
    assert request.inputs
    for tensor in request.inputs:
        assert tensor.datatype in DATATYPES
        if tensor.datatype == "BYTES":
            assert len(tensor.data) == math.prod(tensor.shape)
            assert all(isinstance(item, bytes) for item in tensor.data)
        else:
            assert isinstance(tensor.data, np.ndarray)
            assert tensor.data.shape == tensor.shape
            assert tensor.data.dtype == np.dtype(DATATYPES[tensor.datatype])
    for output in request.outputs or []:
        assert isinstance(output.name, str)
        assert isinstance(output.binary, bool)
        assert output.classification >= 0


def _parse_or_refuse(body: bytes | bytearray, length: int | None) -> None:
    try:
        request = parse_request(body, length, max_json_bytes=1 << 16, max_elements=64)
    except ProtocolError as error:
        refused: ProtocolError | None = error
    else:
        refused = None
    if refused is not None:
        assert 400 <= refused.status < 500
        event(f"refused: {str(refused)[:24]}")
        return
    event("parsed")
    _check_request(request)


VALID = json.dumps(
    {
        "id": "r",
        "inputs": [
            {"name": "image", "datatype": "FP32", "shape": [1, 1, 2, 2], "data": [0.5, 1, 2, 3]},
            {"name": "b", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 9}},
        ],
        "outputs": [{"name": "logits", "parameters": {"binary_data": True, "classification": 2}}],
        "parameters": {"binary_data_output": False},
    }
).encode()
VALID_BODY = VALID + pack_bytes([b"a", b""])


@settings(BOUNDED, max_examples=examples(1000))
@given(body=bodies())
@example(body=(VALID_BODY, len(VALID)))
@example(
    body=(b'{"inputs": [{"name": "x", "datatype": "FP16", "shape": [1], "data": [1e300]}]}', None)
)
@example(
    body=(b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1e300]}]}', None)
)
@example(
    body=(b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1], "data": [-1]}]}', None)
)
@example(
    body=(b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [NaN]}]}', None)
)
@example(
    body=(
        b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["\\ud800"]}]}',
        None,
    )
)
def test_protocol_like_requests_parse_or_raise_a_protocol_error(body):
    _parse_or_refuse(*body)


@settings(BOUNDED, max_examples=examples(1000))
@given(edits=EDITS, keep_length=st.booleans(), shift=st.integers(-3, 3))
def test_mutated_request_bytes_parse_or_raise_a_protocol_error(edits, keep_length, shift):
    """A valid JSON + binary body, its bytes flipped, inserted, deleted or truncated, with the
    original header length, a shifted one, or none."""
    body = _mutate(VALID_BODY, edits)
    _parse_or_refuse(body, len(VALID) + shift if keep_length else None)


@settings(BOUNDED, max_examples=examples(500))
@given(
    body=bodies() | st.just((VALID_BODY, len(VALID))),
    encoding=st.sampled_from(["gzip", "deflate", "GZip", "br", "identity", "", "x-gzip"]),
    cut=st.none() | st.integers(0, 1 << 12),
    edits=st.none() | EDITS,
    limit=st.sampled_from([1 << 16, 64, 0]),
)
def test_compressed_requests_decompress_and_parse_or_raise_a_protocol_error(
    body, encoding, cut, edits, limit
):
    """Bodies compressed as tritonclient compresses them, truncated or corrupted, through
    ``decompress`` then ``parse_request``."""
    raw, length = body
    compressors: dict[str, Callable[[bytes], bytes]] = {
        "gzip": gzip.compress,
        "deflate": zlib.compress,
    }
    packed = compressors.get(encoding.lower(), bytes)(raw)
    if cut is not None:
        packed = packed[: cut % (len(packed) + 1)]
    if edits is not None:
        packed = _mutate(packed, edits)
    try:
        plain = decompress(packed, encoding or None, limit)
    except ProtocolError as error:
        refused: ProtocolError | None = error
    else:
        refused = None
    if refused is not None:
        assert refused.status in (400, 413, 415)
        return
    assert len(plain) <= limit or encoding in ("", "identity")
    _parse_or_refuse(plain, length)


@pytest.mark.parametrize(
    ("datatype", "value"),
    [("FP16", "1e300"), ("FP32", "1e39"), ("INT8", "1e300"), ("INT32", "NaN"), ("UINT8", "-1")],
)
def test_json_numbers_outside_their_datatype_are_refused_not_wrapped(datatype, value):
    """Found by the fuzzer: numpy cast a float out of FP16's or FP32's range to inf with only a
    RuntimeWarning (the integer types were already refused)."""
    body = (
        f'{{"inputs": [{{"name": "x", "datatype": "{datatype}", '
        f'"shape": [1], "data": [{value}]}}]}}'
    )
    with pytest.raises(ProtocolError, match=f"'data' does not fit {datatype}"):
        parse_request(body.encode(), None)
