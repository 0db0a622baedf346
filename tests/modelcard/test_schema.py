"""The published JSON Schema of the model card is the type's, and describes real cards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelcard.card import ModelCard
from modelcard.schema import SCHEMA_ID, schema_text

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
REGENERATE = "python -m modelcard.schema > docs/model-card.schema.json"


def test_the_published_schema_is_the_one_the_type_generates():
    published = (ROOT / SCHEMA_ID).read_text()
    assert published == schema_text(), f"{SCHEMA_ID} is out of date: run `{REGENERATE}`"


def test_the_user_page_says_how_to_regenerate_the_schema():
    assert REGENERATE in (ROOT / "docs" / "model-card.md").read_text()


@pytest.mark.parametrize("fixture", ["shipped-f2652572.json", "first-export.json"])
def test_cards_in_the_current_shape_are_valid_under_the_schema(fixture):
    jsonschema = pytest.importorskip("jsonschema")
    card = ModelCard.from_json((FIXTURES / fixture).read_text()).to_json()
    jsonschema.validate(json.loads(card), json.loads(schema_text()))
