"""The model card's one type: what earlier exports and hand-made cards become, what it refuses
(one line naming the field), and that it needs neither torch nor onnx.

The fixtures are cards as files carry them: ``shipped-f2652572.json`` is the card of the shipped
model's file with sha256 f2652572... (every section but ``null`` values), ``first-export.json``
that of the first exported file (no ``form_choice``, ``served``, ``typicality`` or ``features``).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from modelcard.card import CardError, ModelCard
from modelcard.migration import migrate

FIXTURES = Path(__file__).parent / "fixtures"
SHIPPED = (FIXTURES / "shipped-f2652572.json").read_text()
FIRST = (FIXTURES / "first-export.json").read_text()

#: A card made by hand: what a server needs, nothing else.
MINIMAL: dict[str, Any] = {
    "format": "smso-model-card",
    "version": 1,
    "classes": ["a", "b", "c"],
    "input": {"channels": 1, "height": 28, "width": 28},
    "preprocessing": {"colour": "L", "crop": 28, "mean": [0.5], "std": [0.25]},
    "model": {"backbone": "small_cnn", "head": "smso", "embedding_dim": 4},
    "checkpoint": {"sha256": "0123456789abcdef"},
}


def refusal(card: dict[str, Any]) -> str:
    with pytest.raises(CardError) as refused:
        ModelCard.from_json(json.dumps(card))
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_the_shipped_card_is_in_the_current_shape_and_read_value_for_value():
    """Every value of the card as the file holds it, and no other: what /metadata serves."""
    card = ModelCard.from_json(SHIPPED)
    assert card.model_dump(mode="json") == json.loads(SHIPPED)
    assert migrate(json.loads(SHIPPED)) == json.loads(SHIPPED)
    assert (card.name, card.model_version) == ("fashion_mnist-small_cnn-smso", "b198891e7656")
    assert card.typicality is not None
    assert card.typicality.output == "typicality"
    assert card.outputs.features == ("N", 128)


def test_the_first_exported_card_gets_what_later_exports_added():
    raw = json.loads(FIRST)
    card = ModelCard.from_json(FIRST)
    data = card.model_dump(mode="json")
    assert data["served"] == {"name": "fashion_mnist-small_cnn-smso", "version": "85e28de771c7"}
    assert data["model"]["form_choice"] is None
    assert data["outputs"]["features"] is None
    assert data["typicality"] is None
    added = {"served": None, "typicality": None}
    kept = {key: value for key, value in data.items() if key not in added}
    kept["model"] = {k: v for k, v in kept["model"].items() if k != "form_choice"}
    kept["outputs"] = {k: v for k, v in kept["outputs"].items() if k != "features"}
    assert kept == raw  # nothing else added, nothing changed


def test_a_card_made_by_hand_gets_the_rest_of_the_current_shape():
    card = ModelCard.from_json(json.dumps(MINIMAL))
    assert card.served.name == "unknown-small_cnn-smso"
    assert card.served.version == "0123456789ab"
    assert card.outputs.logits == ("N", 3)
    assert card.outputs.embedding == ("N", 4)
    assert card.input.dynamic_size is False
    assert (card.input.name, card.input.layout, card.input.dtype) == ("image", "NCHW", "float32")
    assert card.preprocessing.resize is None
    assert card.preprocessing.scale == 1 / 255
    assert card.model.head_options == {}
    assert card.checkpoint is not None
    assert card.checkpoint.file is None
    sections = (card.metrics, card.export, card.parity, card.versions, card.typicality)
    assert sections == (None,) * 5
    without = {key: value for key, value in MINIMAL.items() if key != "checkpoint"}
    assert ModelCard.from_json(json.dumps(without)).served.version == "unknown"


def test_migration_adds_only_and_leaves_its_input_alone():
    raw = copy.deepcopy(MINIMAL)
    once = migrate(raw)
    assert raw == MINIMAL
    assert migrate(once) == once
    assert once["classes"] == MINIMAL["classes"]
    assert ModelCard.model_validate(once) == ModelCard.from_json(json.dumps(MINIMAL))


def test_the_card_written_reads_back_as_the_same_bytes():
    card = ModelCard.from_json(SHIPPED)
    text = card.to_json()
    assert ModelCard.from_json(text) == card
    assert ModelCard.from_json(text).to_json() == text
    assert list(json.loads(text))[:3] == ["format", "version", "classes"]  # the fields' order


def test_another_version_is_refused_saying_which_are_read():
    message = refusal(MINIMAL | {"version": 2})
    assert message == "model card version 2 is not supported (supported: 1)"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"format": "onnx-card"}, "format: Input should be 'smso-model-card'"),
        ({"version": "1"}, "version: Input should be 1"),
        ({"version": True}, "version: Input should be a number, not true"),
        ({"notes": "hello"}, "notes: Extra inputs are not permitted"),
        ({"classes": []}, "classes: List should have at least 1 item"),
        ({"input": {"channels": "1", "height": 28, "width": 28}}, "input.channels: Input should"),
        ({"input": {"channels": True, "height": 28, "width": 28}}, "input.channels: Input should"),
        ({"input": {"channels": 1, "height": 28.0, "width": 28}}, "input.height: Input should"),
        ({"input": {"channels": 1, "height": 28, "width": 4097}}, "input.width: Input should be"),
        ({"served": {"name": "..", "version": "1"}}, "served.name: '.' and '..' are no URL"),
        ({"served": {"name": "a/b", "version": "1"}}, "served.name: String should match"),
        ({"checkpoint": {"sha256": "not hex"}}, "checkpoint.sha256: String should match"),
    ],
)
def test_a_field_of_another_type_or_out_of_range_is_refused_on_one_line_naming_it(change, says):
    assert says in refusal(MINIMAL | change)


def test_preprocessing_has_one_mean_and_std_per_channel():
    card = copy.deepcopy(MINIMAL)
    card["preprocessing"]["mean"] = [0.5, 0.5, 0.5]
    assert refusal(card) == (
        "the model card is malformed: preprocessing.mean and preprocessing.std must have 1 "
        "values (input.channels)"
    )


def test_outputs_that_contradict_the_classes_are_refused():
    card = MINIMAL | {"outputs": {"logits": ["N", 10], "embedding": ["N", 4], "features": None}}
    assert refusal(card).endswith("outputs.logits has 10 values per image, the card 3")


def test_a_value_deep_inside_the_typicality_section_is_checked_too():
    raw = json.loads(SHIPPED)
    raw["typicality"]["standardise"][0][1] = float("nan")
    raw["typicality"]["within"]["basis"]["shape"] = [64, "64"]
    message = refusal(raw)
    assert "typicality.standardise.0.1: Input should be a finite number" in message
    assert "typicality.within.basis.shape.1: Input should be a valid integer" in message


def test_the_card_is_frozen():
    card = ModelCard.from_json(json.dumps(MINIMAL))
    with pytest.raises(ValidationError, match="frozen"):
        card.dataset = "other"  # type: ignore[misc]


def test_the_card_needs_neither_torch_nor_onnx_nor_numpy():
    """The serving environment has no torch; modelcard.card needs pydantic alone."""
    code = (
        "import sys, modelcard.card, modelcard.schema; "
        "print(sorted({'torch', 'onnx', 'onnxruntime', 'numpy'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
