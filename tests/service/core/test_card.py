"""The model card the service reads: values it cannot serve are refused when the file is read,
saying which, before anything is allocated for them."""

from __future__ import annotations

import copy
import json

import pytest

from service.core.card import MAX_SIDE, CardError, parse_card
from service.runtime.backend import _card_of
from tests.service.conftest import CARD, CARD_KEY


def card_with(**changes: dict) -> dict[str, str]:
    card = copy.deepcopy(CARD)
    for section, values in changes.items():
        card[section].update(values)
    return {CARD_KEY: json.dumps(card)}


@pytest.mark.parametrize(
    "changes",
    [
        {"input": {"height": 20_000, "width": 20_000}},
        {"input": {"width": MAX_SIDE + 1}},
        {"preprocessing": {"resize": 100_000}},
        {"preprocessing": {"crop": MAX_SIDE + 1}},
    ],
)
def test_an_input_too_large_to_serve_is_refused_naming_the_field(changes):
    with pytest.raises(CardError, match=f"less than or equal to {MAX_SIDE}"):
        parse_card(card_with(**changes))


def test_the_largest_side_allowed_is_read():
    card, _ = parse_card(card_with(input={"height": MAX_SIDE, "width": MAX_SIDE}))
    assert card.input.height == MAX_SIDE


def test_a_card_error_names_the_file():
    with pytest.raises(CardError, match=r"^/models/a/1/model.onnx: the model file has no model"):
        _card_of("/models/a/1/model.onnx", {})


def test_the_largest_value_of_a_preprocessed_image():
    card, _ = parse_card(card_with(preprocessing={"mean": [0.5], "std": [0.25]}))
    assert card.preprocessing.largest_value == pytest.approx(2.0)  # (1 - 0.5) / 0.25
