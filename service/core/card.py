"""The model card the service reads from an ONNX file's metadata (written by ``smso-export``).

The card is :class:`modelcard.card.ModelCard`, read through its migration and its bounds
(:meth:`~modelcard.card.ModelCard.from_json`): a file without a card, with a card of another
format or version, or with one that cannot be served (a field out of its range, a ``std`` of 0,
JSON nested deeper than :data:`MAX_DEPTH`) is refused with one line that names the field. What
the card says of the graph (its classes, embedding size and input) is checked against the graph
where it is loaded (:mod:`service.runtime.backend`).
"""

from __future__ import annotations

from typing import Any

from modelcard import CARD_KEY
from modelcard.card import (
    MAX_DEPTH,
    MAX_SIDE,
    CardError,
    InputSpec,
    ModelCard,
    Preprocessing,
    nesting_depth,
)

__all__ = [
    "CARD_KEY",
    "MAX_DEPTH",
    "MAX_SIDE",
    "CardError",
    "InputSpec",
    "ModelCard",
    "Preprocessing",
    "nesting_depth",
    "parse_card",
]


def parse_card(metadata: dict[str, str]) -> tuple[ModelCard, dict[str, Any]]:
    """The card in an ONNX file's custom metadata, and the same card as JSON data (what
    ``GET /metadata`` serves, its typicality arrays aside); :class:`CardError` with one line
    naming what is wrong otherwise."""
    if CARD_KEY not in metadata:
        raise CardError(
            f"the model file has no model card (metadata key {CARD_KEY!r}); "
            "export it with smso-export"
        )
    card = ModelCard.from_json(metadata[CARD_KEY])
    return card, card.model_dump(mode="json")
