"""A request's cost is bounded by its size: requested outputs are checked in linear time, a
request that names more inputs or outputs than the model has is refused before its tensors are
looked at, and every message that echoes a client's names stays short."""

from __future__ import annotations

import json
import time

import pytest

from service.protocol.codec import Offered, ProtocolError, listed, parse_request, quoted

#: the shipped model's tensors (service.protocol.semantics.offered gives them for any model)
MODEL = Offered(inputs=("image", "image_bytes"), outputs=("logits", "embedding"))
IMAGE = {"name": "image", "datatype": "FP32", "shape": [1], "data": [0.5]}


def body(outputs: int, inputs: int = 1) -> bytes:
    request = {
        "inputs": [IMAGE | {"name": f"i{i}"} for i in range(inputs)],
        "outputs": [{"name": f"o{i}"} for i in range(outputs)],
    }
    return json.dumps(request).encode()


def test_many_requested_outputs_are_checked_in_linear_time():
    """Each output was compared with every earlier one: 40,000 outputs took 173 s (16,000 held
    the event loop for 7 s). Without a model's bound (the codec alone), 40,000 distinct names
    parse in a fraction of a second (the bound leaves room for a busy machine)."""
    text = body(40_000)
    best = float("inf")
    for _ in range(3):  # the best of three: the machine may be shared
        start = time.perf_counter()
        request = parse_request(text, None)
        best = min(best, time.perf_counter() - start)
    assert request.outputs is not None
    assert len(request.outputs) == 40_000
    assert best < 3.0, f"40,000 outputs: {best:.2f} s"


def test_an_output_requested_twice_is_refused_naming_it():
    text = json.dumps({"inputs": [IMAGE], "outputs": [{"name": "logits"}, {"name": "logits"}]})
    with pytest.raises(ProtocolError, match="output 'logits' is requested twice"):
        parse_request(text.encode(), None, offered=MODEL)


@pytest.mark.parametrize(
    ("outputs", "inputs", "says"),
    [
        (40_000, 1, "names 40,000 outputs; the model has 2 (logits, embedding)"),
        (3, 1, "names 3 outputs; the model has 2 (logits, embedding)"),
        (0, 50_000, "has 50,000 inputs; the model has 2 (image, image_bytes)"),
    ],
)
def test_more_tensors_than_the_model_has_are_refused_before_they_are_read(outputs, inputs, says):
    text = body(outputs, inputs)
    start = time.perf_counter()
    with pytest.raises(ProtocolError) as refused:
        parse_request(text, None, offered=MODEL)
    seconds = time.perf_counter() - start
    assert says in str(refused.value)
    assert refused.value.status == 400
    assert seconds < 5.0, f"refused after {seconds:.2f} s"  # a bound on a hang


def test_as_many_outputs_as_the_model_has_are_accepted():
    assert parse_request(body(0), None, offered=MODEL).outputs == []  # every output
    text = json.dumps({"inputs": [IMAGE], "outputs": [{"name": "logits"}, {"name": "embedding"}]})
    request = parse_request(text.encode(), None, offered=MODEL)
    assert [o.name for o in (request.outputs or [])] == ["logits", "embedding"]


@pytest.mark.parametrize(
    "header",
    [
        {"inputs": [IMAGE | {"name": "n" * 1_000_000, "datatype": "FP128"}]},
        {"inputs": [IMAGE | {"name": "n" * 1_000_000, "shape": [-1]}]},
        {"inputs": [IMAGE], "outputs": [{"name": "o" * 1_000_000}] * 2},
        {
            "inputs": [IMAGE],
            "outputs": [{"name": "o" * 1_000_000, "parameters": {"binary_data": 1}}],
        },
    ],
)
def test_an_error_about_a_long_name_stays_short(header):
    """A name of a megabyte is echoed by its first characters and its length."""
    with pytest.raises(ProtocolError) as refused:
        parse_request(json.dumps(header).encode(), None, offered=MODEL)
    message = str(refused.value)
    assert len(message) < 400, message[:400]
    assert "1,000,000 characters" in message


def test_quoted_and_listed_keep_client_names_short():
    assert quoted("logits") == "'logits'"
    assert quoted("x" * 100) == "'" + "x" * 64 + "'... (100 characters)"
    assert listed(["a", "b"]) == "'a', 'b'"
    names = [f"n{i}" for i in range(50_000)]
    assert listed(names) == "'n0', 'n1', 'n2', 'n3', 'n4' and 49,995 more"
