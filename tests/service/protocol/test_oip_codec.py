"""Open Inference Protocol bodies: JSON and binary tensors in, JSON and binary tensors out, and an
error that says what was expected for each malformed request."""

from __future__ import annotations

import gzip
import json
import zlib

import numpy as np
import pytest

from service.protocol.codec import (
    OutputTensor,
    ProtocolError,
    decompress,
    encode_response,
    pack_bytes,
    parse_request,
    unpack_bytes,
)


def binary_body(header: dict, *chunks: bytes) -> tuple[bytes, int]:
    text = json.dumps(header).encode()
    return text + b"".join(chunks), len(text)


def test_json_tensors_flat_or_nested_become_arrays_of_their_shape():
    values = np.arange(12, dtype=np.float32).reshape(2, 1, 2, 3)
    for data in (values.reshape(-1).tolist(), values.tolist()):
        body = json.dumps(
            {
                "id": "r1",
                "inputs": [
                    {"name": "image", "shape": [2, 1, 2, 3], "datatype": "FP32", "data": data}
                ],
            }
        )
        request = parse_request(body.encode(), None)
        (tensor,) = request.inputs
        assert request.id == "r1"
        assert request.outputs is None
        assert not request.binary_output
        assert isinstance(tensor.data, np.ndarray)
        assert tensor.data.dtype == np.float32
        assert not tensor.binary
        np.testing.assert_array_equal(tensor.data, values)


def test_binary_tensors_follow_the_json_header_in_input_order():
    floats = np.linspace(-1, 1, 6, dtype=np.float32).reshape(1, 1, 2, 3)
    images = [b"\x89PNG first", b"", b"\xff\xd8 third"]
    packed = pack_bytes(images)
    header = {
        "inputs": [
            {
                "name": "a",
                "shape": [1, 1, 2, 3],
                "datatype": "FP32",
                "parameters": {"binary_data_size": floats.nbytes},
            },
            {
                "name": "b",
                "shape": [3],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(packed)},
            },
        ],
        "outputs": [{"name": "logits", "parameters": {"binary_data": True, "classification": 2}}],
        "parameters": {"binary_data_output": True, "timeout": 5},
    }
    body, length = binary_body(header, floats.astype("<f4").tobytes(), packed)
    request = parse_request(body, length)
    a, b = request.inputs
    np.testing.assert_array_equal(a.data, floats)
    assert b.data == images
    assert a.binary
    assert b.binary
    assert request.outputs is not None
    assert request.outputs[0].binary
    assert request.outputs[0].classification == 2
    assert request.binary_output
    assert request.parameters["timeout"] == 5


def test_bytes_elements_round_trip():
    items = [b"", b"x", bytes(range(256)) * 3]
    assert unpack_bytes(pack_bytes(items), 3, "t") == items


@pytest.mark.parametrize(
    ("header", "tail", "expected"),
    [
        ({"inputs": []}, b"", "non-empty 'inputs'"),
        (
            {"inputs": [{"name": "x", "shape": [2], "datatype": "FP33", "data": [1, 2]}]},
            b"",
            "datatype 'FP33' is not one of",
        ),
        (
            {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3]}]},
            b"",
            "shape [2, 2] needs 4 elements, 'data' has 3",
        ),
        (
            {"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]},
            b"",
            "shape must be a list of at most 8 integers in [0, 2147483648)",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [0, 3, 2**31 - 1, 2**31 - 1],
                        "datatype": "BOOL",
                        "parameters": {"binary_data_size": 0},
                    }
                ]
            },
            b"",
            "describes more elements than an array holds",
        ),
        (
            {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": ["a", "b"]}]},
            b"",
            "FP32 'data' must be JSON numbers",
        ),
        (
            {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32"}]},
            b"",
            "neither 'data' nor parameters.binary_data_size",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [2],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": 8},
                    }
                ]
            },
            b"\0" * 4,
            "does not fit the 4 binary bytes left",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [3],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": 8},
                    }
                ]
            },
            b"\0" * 8,
            "shape [3] of FP32 is 12 bytes, binary_data_size says 8",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [1],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": 4},
                    }
                ]
            },
            b"\0" * 6,
            "2 bytes after the JSON header belong to no input",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [2],
                        "datatype": "BYTES",
                        "parameters": {"binary_data_size": 9},
                    }
                ]
            },
            pack_bytes([b"abcde"]),
            "binary BYTES data ends before element 1",
        ),
        (
            {"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": [3]}]},
            b"",
            "BYTES data in JSON must be strings",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [1],
                        "datatype": "FP32",
                        "data": [1],
                        "parameters": {"shared_memory_region": "r"},
                    }
                ]
            },
            b"",
            "shared-memory extension is not supported",
        ),
        (
            {
                "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
                "outputs": [{"name": "logits", "parameters": {"classification": -1}}],
            },
            b"",
            "classification must be a non-negative integer",
        ),
    ],
)
def test_each_malformed_request_says_what_is_wrong(header, tail, expected):
    body, length = binary_body(header, tail)
    with pytest.raises(ProtocolError) as caught:
        parse_request(body, length)
    assert expected in str(caught.value)
    assert caught.value.status == 400


def test_a_body_that_is_not_json_or_whose_header_length_is_wrong_is_refused():
    with pytest.raises(ProtocolError, match=r"not valid JSON.*Inference-Header-Content-Length"):
        parse_request(b'{"inputs": []}\x00\x01binary', None)
    with pytest.raises(ProtocolError, match="is 99 but the body is 14 bytes"):
        parse_request(b'{"inputs": []}', 99)
    with pytest.raises(ProtocolError, match="JSON object"):
        parse_request(b"[1, 2]", None)


def test_gzip_and_deflate_bodies_are_inflated_under_the_limit():
    body = b'{"inputs": []}' * 100
    assert decompress(gzip.compress(body), "gzip", 10_000) == body
    assert decompress(zlib.compress(body), "deflate", 10_000) == body
    assert decompress(body, None, 10) == body  # not compressed: the read limit already applied
    bomb = gzip.compress(b"\0" * 1_000_000)
    with pytest.raises(ProtocolError, match="larger than 1,000 bytes") as caught:
        decompress(bomb, "gzip", 1_000)
    assert caught.value.status == 413
    with pytest.raises(ProtocolError, match="not supported; use gzip, deflate") as caught:
        decompress(body, "br", 10_000)
    assert caught.value.status == 415
    with pytest.raises(ProtocolError, match="not valid gzip"):
        decompress(b"not gzip", "gzip", 10_000)


def test_responses_are_json_or_binary_per_output():
    logits = np.array([[1.5, -2.0], [0.25, 3.0]], np.float32)
    labels = [b"0.9:1:b", b"0.8:0:a"]
    outputs = [
        OutputTensor("logits", "FP32", (2, 2), logits, binary=False),
        OutputTensor("embedding", "FP32", (2, 2), logits * 2, binary=True),
        OutputTensor("classes", "BYTES", (2, 1), labels, binary=True),
        OutputTensor("names", "BYTES", (2, 1), labels, binary=False),
    ]
    body, length = encode_response("m", "v1", "req-7", outputs)
    header = json.loads(body[:length])
    assert header["model_name"] == "m"
    assert header["model_version"] == "v1"
    assert header["id"] == "req-7"
    json_logits, binary_embedding, binary_classes, json_names = header["outputs"]
    assert json_logits["data"] == [1.5, -2.0, 0.25, 3.0]
    assert json_logits["shape"] == [2, 2]
    assert json_names["data"] == ["0.9:1:b", "0.8:0:a"]
    size = binary_embedding["parameters"]["binary_data_size"]
    tail = body[length:]
    np.testing.assert_array_equal(np.frombuffer(tail[:size], "<f4").reshape(2, 2), logits * 2)
    assert unpack_bytes(tail[size:], 2, "classes") == labels
    assert binary_classes["parameters"]["binary_data_size"] == len(tail) - size

    only_json, no_length = encode_response("m", "v1", None, outputs[:1])
    assert no_length is None
    assert "id" not in json.loads(only_json)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '{"inputs": [{"name": "x", "shape": [1], "datatype": [], "data": [1]}]}',
            "datatype [] is not one of",
        ),
        (
            '{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [[[[1]]]]}]}',
            "nested deeper than its shape",
        ),
        (
            '{"inputs": [{"name": "x", "shape": [' + ",".join(["1"] * 9) + '], "datatype": "FP32", '
            '"data": [1]}]}',
            "at most 8 integers",
        ),
        (
            '{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": ['
            + "9" * 5000
            + "]}]}",
            "a number in the request's JSON has more than 4,300 digits",
        ),
        ('{"inputs": [' * 100_000, "the request's JSON is nested too deeply"),
        (
            '{"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["\\ud800"]}]}',
            "not valid UTF-8",
        ),
        (
            '{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": ["1.5"]}]}',
            "FP32 'data' must be JSON numbers",
        ),
        (
            '{"inputs": [{"name": "x", "shape": [1], "datatype": "BOOL", "data": [1]}]}',
            "BOOL 'data' must be JSON true or false",
        ),
        (
            '{"inputs": [{"name": "x", "shape": [1], "datatype": "UINT8", "data": [300]}]}',
            "'data' does not fit UINT8",
        ),
        (
            '{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], '
            '"outputs": [{"name": "y", "parameters": {"binary_data": "false"}}]}',
            "binary_data must be true or false, got 'false'",
        ),
        (
            '{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], '
            '"outputs": [{"name": "y"}, {"name": "y"}]}',
            "output 'y' is requested twice",
        ),
        (
            '{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], '
            '"parameters": {"binary_data_output": 1}}',
            "binary_data_output must be true or false",
        ),
    ],
)
def test_hostile_or_sloppy_json_is_a_400_that_says_why(text, expected):
    with pytest.raises(ProtocolError) as caught:
        parse_request(text.encode(), None)
    assert expected in str(caught.value)
    assert caught.value.status == 400


def test_a_boolean_is_not_a_binary_size():
    body, length = binary_body(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [1],
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": True},
                }
            ]
        },
        b"\x07",
    )
    with pytest.raises(ProtocolError, match="binary_data_size must be a number of bytes"):
        parse_request(body, length)


def test_size_limits_are_413_before_the_work():
    big = json.dumps(
        {"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["a" * 5000]}]}
    ).encode()
    with pytest.raises(ProtocolError, match="more than 4,096; send large tensors as binary") as e:
        parse_request(big, None, max_json_bytes=4096)
    assert e.value.status == 413
    packed = pack_bytes([b""] * 100_000)  # a cheap body, a costly unpacking
    body, length = binary_body(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [100_000],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(packed)},
                }
            ]
        },
        packed,
    )
    with pytest.raises(ProtocolError, match="100000 BYTES elements; at most 64 per request") as e:
        parse_request(body, length, max_elements=64)
    assert e.value.status == 413


def test_a_malformed_input_is_400_even_after_a_too_large_one():
    """Every input's datatype and shape are checked before any size limit: a request that
    breaks the schema is a 400 whichever of its inputs breaks it (a fuzzer's finding)."""
    inputs = [
        {"name": "big", "shape": [9115, 290145], "datatype": "BYTES", "data": []},
        {"name": "bad", "shape": [1, 2**31], "datatype": "FP32", "data": []},
    ]
    with pytest.raises(ProtocolError, match="'bad': shape must be") as e:
        parse_request(json.dumps({"inputs": inputs}).encode(), None, max_elements=64)
    assert e.value.status == 400


def test_binary_data_output_is_the_default_of_listed_outputs():
    body = {
        "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
        "outputs": [{"name": "a"}, {"name": "b", "parameters": {"binary_data": False}}],
        "parameters": {"binary_data_output": True},
    }
    outputs = parse_request(json.dumps(body).encode(), None).outputs
    assert outputs is not None
    a, b = outputs
    assert a.binary
    assert not b.binary


def test_incomplete_or_padded_compressed_bodies_are_refused():
    packed = gzip.compress(b'{"inputs": []}')
    with pytest.raises(ProtocolError, match="not one complete gzip stream"):
        decompress(packed[:-4], "gzip", 10_000)
    with pytest.raises(ProtocolError, match="not one complete gzip stream"):
        decompress(packed + b"junk", "gzip", 10_000)
