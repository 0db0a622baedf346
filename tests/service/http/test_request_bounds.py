"""The REST door of the Open Inference Protocol answers a request that names many outputs or
inputs at once, with a 400 that names the model's tensors, whatever their number: the cost of
a request is bounded by its size, not by the square of what it lists."""

from __future__ import annotations

import json
import time

import pytest

from tests.service.http.test_oip import INFER

IMAGE = {"name": "image", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [0.0] * 784}


@pytest.mark.parametrize("count", [3, 8_000, 40_000])
def test_more_outputs_than_the_model_has_are_a_400_at_once(make_client, count):
    """8,000 outputs stalled /healthz for 2.5 s; 40,000 held a decode thread for 173 s (2
    cores). The bound on the time is one on a hang, not a measure (measured: 0.43 s at most)."""
    client = make_client()
    body = json.dumps({"inputs": [IMAGE], "outputs": [{"name": f"o{i}"} for i in range(count)]})
    start = time.perf_counter()
    response = client.post(INFER, content=body)
    seconds = time.perf_counter() - start
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert f"names {count:,} outputs; the model has 2 (logits, embedding)" in error
    assert seconds < 10.0, f"{seconds:.2f} s"


def test_an_unknown_output_with_a_long_name_is_a_short_400(make_client):
    client = make_client()
    body = json.dumps({"inputs": [IMAGE], "outputs": [{"name": "x" * 1_000_000}]})
    response = client.post(INFER, content=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert len(error) < 400, error[:400]
    assert "unknown output 'xxxx" in error
    assert "outputs: logits, embedding" in error


def test_two_inputs_with_long_names_are_a_short_400(make_client):
    client = make_client()
    inputs = [IMAGE | {"name": "a" * 500_000}, IMAGE | {"name": "b" * 500_000}]
    response = client.post(INFER, content=json.dumps({"inputs": inputs}))
    assert response.status_code == 400
    error = response.json()["error"]
    assert len(error) < 800, error[:800]
    assert "send exactly one input" in error
