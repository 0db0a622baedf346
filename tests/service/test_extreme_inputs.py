"""A client's own FP32 tensor with finite but extreme values can make the model's outputs NaN or
infinite: that is the input's fault (400 ``input_out_of_range``), not the model file's (500),
and other requests batched with it are answered as usual."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.settings import Settings
from service.runtime.outputs import BackendOutputs
from service.runtime.runner import Batch
from tests.service.conftest import FakeBackend, grey, wait_ready
from tests.service.http.test_oip import INFER, tensor_input


class Overflowing(FakeBackend):
    """Like a real network: a row whose values are huge gives infinite logits."""

    def run(self, images: Batch) -> BackendOutputs:
        with np.errstate(all="ignore"):  # the fake's statistics overflow too
            outputs = super().run(images)
        logits, embedding = outputs.logits, outputs.embedding
        huge = np.abs(np.asarray(images)).reshape(len(logits), -1).max(axis=1) > 1e15
        logits[huge] = np.inf
        return BackendOutputs(logits=logits, embedding=embedding)


class Broken(FakeBackend):
    def run(self, images: Batch) -> BackendOutputs:
        outputs = super().run(images)
        return BackendOutputs(
            logits=np.full_like(outputs.logits, np.nan), embedding=outputs.embedding
        )


def test_extreme_values_are_the_inputs_fault_and_the_other_rows_are_answered(make_client):
    client = make_client(Overflowing(), max_wait_ms=50)
    images = np.zeros((2, 1, 28, 28), np.float32)
    images[1, 0, 0, 0] = 1e20
    refused = client.post(INFER, json={"inputs": [tensor_input(images[1:])]})
    assert refused.status_code == 400, refused.text
    assert "reach 1e+20" in refused.json()["error"]
    answered = client.post(INFER, json={"inputs": [tensor_input(images[:1])]})
    assert answered.status_code == 200, answered.text
    assert client.post("/classify", files=[("file", ("a.png", grey(9), "image/png"))]).is_success


def test_in_range_inputs_with_non_finite_outputs_still_blame_the_model(make_client, caplog):
    client = make_client(Broken())
    images = np.full((1, 1, 28, 28), 2.0, np.float32)  # within a preprocessed image's range
    response = client.post(INFER, json={"inputs": [tensor_input(images)]})
    assert response.status_code == 500
    assert "the model file is at fault" in response.json()["error"]
    assert "NaN or infinite outputs" in caplog.text


@pytest.mark.slow
def test_the_shipped_model_answers_400_for_values_that_overflow_it(shipped_model):
    """The audit's case on the real model: FP32 values of 1e20 and more overflow it; 1e10
    does not (an answer, however meaningless)."""
    with TestClient(create_app(Settings(model_path=shipped_model, max_batch_size=4))) as client:
        wait_ready(client)
        name = client.get("/metadata").json()["model"]["name"]
        for value, status in ((1e10, 200), (1e20, 400), (3e38, 400)):
            images = np.full((1, 1, 28, 28), value, np.float32)
            answer = client.post(
                f"/v2/models/{name}/infer", json={"inputs": [tensor_input(images)]}
            )
            assert answer.status_code == status, answer.text
        assert "preprocessed as the card says" in answer.json()["error"]
