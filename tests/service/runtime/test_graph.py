"""What a model card says of its graph is checked when the file is loaded: a card that
contradicts its graph is refused on one line naming the card's field, never a 500 later."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.core.card import CARD_KEY, CardError, parse_card
from service.runtime.backend import OnnxBackend
from service.runtime.graph import check_outputs
from service.runtime.outputs import BackendOutputs
from tests.service.models.graphs import card, model_file


@pytest.mark.parametrize(
    ("file", "field", "says"),
    [
        ({"model_card": card(classes=["a", "b", "c"]), "logits": 10}, "classes", "says 3"),
        (
            {"model_card": card(model={"embedding_dim": 3}), "embedding": 64},
            "model.embedding_dim",
            "says 3",
        ),
        ({"image": ("batch", 3, 28, 28)}, "input.channels", "is 1"),
        ({"image": ("batch", 1, 32, 28)}, "input.height", "is 28"),
    ],
)
def test_a_card_that_contradicts_its_graph_is_refused_naming_the_field(tmp_path, file, field, says):
    path = model_file(tmp_path / "model.onnx", **file)
    with pytest.raises(CardError) as refused:
        OnnxBackend(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: the model card contradicts its graph: {field} {says}, ")
    assert "\n" not in message


def test_a_graph_without_the_image_input_is_refused(tmp_path):
    path = model_file(tmp_path / "model.onnx", image=("batch", 1, 28))
    with pytest.raises(CardError, match=r"the graph's 'image' input has the shape"):
        OnnxBackend(path)


def test_symbolic_dimensions_are_left_to_the_outputs_check(tmp_path):
    path = model_file(
        tmp_path / "model.onnx", card(classes=["a", "b", "c"]), logits="classes", embedding="p"
    )
    backend = OnnxBackend(path)  # 3 classes declared symbolic, 3 values answered: consistent
    check_outputs(backend.card, 2, backend.run(np.zeros((2, 1, 28, 28), np.float32)))


def test_outputs_of_another_shape_than_the_card_says_are_refused_naming_the_field():
    parsed = parse_card({CARD_KEY: json.dumps(card(classes=["a", "b", "c"]))})[0]
    ten, three = np.zeros((2, 10), np.float32), np.zeros((2, 3), np.float32)
    four, wide = np.zeros((2, 4), np.float32), np.zeros((2, 64), np.float32)
    with pytest.raises(CardError, match=r"^the model card contradicts its graph: classes says 3, "):
        check_outputs(parsed, 2, BackendOutputs(logits=ten, embedding=four))
    check_outputs(parsed, 2, BackendOutputs(logits=three, embedding=four))
    with pytest.raises(CardError, match=r"model\.embedding_dim says 4"):
        check_outputs(parsed, 2, BackendOutputs(logits=three, embedding=wide))
