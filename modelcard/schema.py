"""The model card's JSON Schema, generated from :class:`modelcard.card.ModelCard`.

    python -m modelcard.schema > docs/model-card.schema.json

prints what ``docs/model-card.schema.json`` publishes (a test checks that the two agree).
"""

from __future__ import annotations

import json

from modelcard.card import ModelCard

__all__ = ["SCHEMA_ID", "schema", "schema_text"]

#: Where the schema is published, relative to the repository.
SCHEMA_ID = "docs/model-card.schema.json"


def schema() -> dict[str, object]:
    """The JSON Schema (draft 2020-12) of a card in the current shape: what ``smso-export``
    writes. Older cards are read through :func:`modelcard.migration.migrate` first."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **ModelCard.model_json_schema(),
    }


def schema_text() -> str:
    """:func:`schema` as the published file holds it: two-space indents, a final newline."""
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    print(schema_text(), end="")
