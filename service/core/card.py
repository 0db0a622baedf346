"""The model card the service reads from an ONNX file's metadata (written by ``smso-export``).

Only the fields the service uses are typed; the rest of the card is kept as it is and served by
``GET /metadata``. A file without a card, or with a card of another format or version, is
refused with a message that says so.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from modelcard import CARD_KEY, CARD_VERSION

__all__ = ["CARD_KEY", "CardError", "InputSpec", "ModelCard", "Preprocessing", "parse_card"]

#: The card versions this service reads.
SUPPORTED_VERSIONS = (CARD_VERSION,)


class CardError(ValueError):
    """The model file has no usable model card."""


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


#: The largest side a card may give its input, resize or crop: four times the largest of
#: the paper's models (448 px), and a batch of 16 such images still under 4 GB of float32.
MAX_SIDE = 4096


class InputSpec(_Part):
    name: str = "image"
    channels: Literal[1, 3]
    height: int = Field(ge=1, le=MAX_SIDE)
    width: int = Field(ge=1, le=MAX_SIDE)
    dynamic_size: bool = False


class Preprocessing(_Part):
    colour: Literal["L", "RGB"]
    resize: int | None = Field(None, ge=1, le=MAX_SIDE)
    crop: int = Field(ge=1, le=MAX_SIDE)
    mean: list[float]
    std: list[float]

    @property
    def largest_value(self) -> float:
        """The largest ``|x|`` a preprocessed image can hold: pixels in [0, 1] become
        ``(x - mean) / std``, so ``max over channels of max(|0 - m|, |1 - m|) / s``."""
        return max(
            max(abs(m), abs(1 - m)) / abs(s) for m, s in zip(self.mean, self.std, strict=False)
        )


class ModelInfo(_Part):
    backbone: str
    head: str
    embedding_dim: int = Field(ge=1)


class Served(_Part):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    version: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$")


class ModelCard(_Part):
    format: Literal["smso-model-card"]
    version: int
    classes: list[str] = Field(min_length=1)
    input: InputSpec
    preprocessing: Preprocessing
    model: ModelInfo
    dataset: str = "unknown"
    checkpoint: dict[str, Any] = Field(default_factory=dict)
    served: Served | None = None  # smso-export --name/--version; older cards have none

    @property
    def name(self) -> str:
        """``<dataset>-<backbone>-<head>``, e.g. ``fashion_mnist-small_cnn-smso``."""
        if self.served is not None:
            return self.served.name
        return f"{self.dataset}-{self.model.backbone}-{self.model.head}"

    @property
    def model_version(self) -> str:
        """The first 12 hex digits of the source checkpoint's sha256."""
        if self.served is not None:
            return self.served.version
        return str(self.checkpoint.get("sha256", "unknown"))[:12]


def parse_card(metadata: dict[str, str]) -> tuple[ModelCard, dict[str, Any]]:
    """The typed card and the full card dictionary from an ONNX file's custom metadata."""
    if CARD_KEY not in metadata:
        raise CardError(
            f"the model file has no model card (metadata key {CARD_KEY!r}); "
            "export it with smso-export"
        )
    try:
        raw = json.loads(metadata[CARD_KEY])
        card = ModelCard.model_validate(raw)
    except (json.JSONDecodeError, ValidationError) as error:
        raise CardError(f"the model card is malformed: {error}") from None
    if card.version not in SUPPORTED_VERSIONS:
        raise CardError(
            f"model card version {card.version} is not supported (supported: {SUPPORTED_VERSIONS})"
        )
    channels = card.input.channels
    if len(card.preprocessing.mean) != channels or len(card.preprocessing.std) != channels:
        raise CardError(f"the model card's mean and std must have {channels} values")
    return card, raw
