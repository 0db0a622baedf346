"""The model card the service reads: values it cannot serve are refused when the file is read,
saying which, before anything is allocated for them."""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path

import pytest

from service.core.card import MAX_DEPTH, MAX_SIDE, CardError, nesting_depth, parse_card
from service.runtime.session_builder import _card_of
from tests.service.conftest import CARD, CARD_KEY

#: The shipped model's card as its file held it (a copy kept with the card's own tests).
SHIPPED_CARD = Path(__file__).parents[2] / "modelcard" / "fixtures" / "shipped-f2652572.json"


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


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"preprocessing": {"std": [0]}}, "preprocessing.std.0"),
        ({"preprocessing": {"std": [-0.5]}}, "preprocessing.std.0"),
        ({"preprocessing": {"std": [float("nan")]}}, "preprocessing.std.0"),
        ({"preprocessing": {"mean": [float("inf")]}}, "preprocessing.mean.0"),
        ({"model": {"embedding_dim": 0}}, "model.embedding_dim"),
    ],
)
def test_a_value_no_image_can_be_served_with_is_refused_on_one_line_naming_it(changes, field):
    with pytest.raises(CardError) as refused:
        parse_card(card_with(**changes))
    message = str(refused.value)
    assert message.startswith(f"the model card is malformed: {field}: ")
    assert "\n" not in message


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("depth", [MAX_DEPTH, 900, 200_000])
def test_a_card_nested_too_deep_is_refused_before_it_is_parsed(depth):
    raw = json.dumps(CARD)[:-1] + ', "notes": ' + "[" * depth + "]" * depth + "}"
    with pytest.raises(CardError, match=f"more than {MAX_DEPTH} levels deep"):
        parse_card({CARD_KEY: raw})


def test_a_card_as_deep_as_allowed_is_read():
    card = copy.deepcopy(CARD)
    card["model"]["head_options"] = nested(MAX_DEPTH - 2)  # below the card and its model
    assert nesting_depth(json.dumps(card)) == MAX_DEPTH
    read = parse_card({CARD_KEY: json.dumps(card)})[1]
    assert read["model"]["head_options"] == card["model"]["head_options"]


def test_the_card_served_is_the_files_card_value_for_value():
    """``GET /metadata`` serves the card as the file holds it (the shipped model's, before
    its typicality arrays are summarised): the type keeps every value and adds none."""
    text = SHIPPED_CARD.read_text()
    card, served = parse_card({CARD_KEY: text})
    assert served == json.loads(text)
    assert card.name == "fashion_mnist-small_cnn-smso"


def test_a_string_left_open_is_scanned_once_and_refused():
    """A string that is never closed, full of escaped quotes: the depth scan once tried it again
    from each quote (8 kB 0.24 s, 32 kB 2.7 s: a 1 MB card about 45 minutes, the GIL held).
    Now 1 MB is one pass, and the card is refused as JSON that does not parse. The thread and
    its join are a bound on a hang, not a measure."""
    text = '"' + '\\"' * 500_000  # 1 MB
    found: list[int] = []
    scan = threading.Thread(target=lambda: found.append(nesting_depth(text)), daemon=True)
    scan.start()
    scan.join(60)
    assert found == [0]
    with pytest.raises(CardError):
        parse_card({CARD_KEY: text})
    assert nesting_depth('{"a": "x\\"", "b": "[[[', limit=5) == 1  # open at the end: no bracket


def test_brackets_inside_strings_do_not_count_as_nesting():
    assert nesting_depth(json.dumps({"a": ["[[[{{{", '"]]]', {"b": "\\"}]})) == 3
    assert nesting_depth("[" * 10_000, limit=5) == 6  # stops counting past the limit


@pytest.mark.parametrize("raw", ["[1, 2]", "not json", '{"a": '])
def test_metadata_that_is_no_json_object_is_refused_on_one_line(raw):
    with pytest.raises(CardError, match=r"^the model card is malformed: not") as refused:
        parse_card({CARD_KEY: raw})
    assert "\n" not in str(refused.value)
