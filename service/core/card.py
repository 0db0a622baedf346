"""The model card the service reads from an ONNX file's metadata (written by ``smso-export``).

Only the fields the service uses are typed; the rest of the card is kept as it is and served by
``GET /metadata``. A file without a card, with a card of another format or version, or with one
that cannot be served (a field out of its range, a ``std`` of 0, JSON nested deeper than
:data:`MAX_DEPTH`) is refused with one line that names the field. What the card says of the
graph (its classes, embedding size and input) is checked against the graph where it is loaded
(:mod:`service.runtime.backend`).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from modelcard import CARD_KEY, CARD_VERSION

__all__ = [
    "CARD_KEY",
    "MAX_DEPTH",
    "CardError",
    "InputSpec",
    "ModelCard",
    "Preprocessing",
    "nesting_depth",
    "parse_card",
]

#: The card versions this service reads.
SUPPORTED_VERSIONS = (CARD_VERSION,)


class CardError(ValueError):
    """The model file has no usable model card."""


class _Part(BaseModel):
    # NaN and infinities (which Python's json reads) are no mean, std or size
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)


#: The deepest nesting of lists and objects a card may hold: an exported card is 4 deep (the
#: typicality section's basis); JSON nested far deeper than this could not be parsed or served
#: without running out of stack.
MAX_DEPTH = 32


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
    std: list[Annotated[float, Field(gt=0)]]  # each pixel is divided by it

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


#: A JSON string (its escapes included; one left open runs to the end of the text, matched once
#: rather than tried again from each of its quotes, which took time quadratic in its length),
#: and what is not a bracket.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def nesting_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """How deeply the lists and objects of the JSON ``text`` nest, counted without parsing it
    (brackets inside strings do not count), up to ``limit + 1``: a card nested 200,000 deep is
    refused before ``json`` recurses into it."""
    depth = deepest = 0
    for bracket in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        if bracket in "[{":
            depth += 1
            if depth > limit:
                return depth
            deepest = max(deepest, depth)
        elif bracket in "]}":
            depth -= 1
    return deepest


def _one_line(error: ValidationError) -> str:
    """Each refused field of the card by its place (``preprocessing.std.0``) and why."""
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or 'the card'}: {item['msg']}"
        for item in error.errors(include_url=False)
    )


def parse_card(metadata: dict[str, str]) -> tuple[ModelCard, dict[str, Any]]:
    """The typed card and the full card dictionary from an ONNX file's custom metadata;
    :class:`CardError` with one line naming what is wrong otherwise."""
    if CARD_KEY not in metadata:
        raise CardError(
            f"the model file has no model card (metadata key {CARD_KEY!r}); "
            "export it with smso-export"
        )
    text = metadata[CARD_KEY]
    if nesting_depth(text) > MAX_DEPTH:
        raise CardError(
            f"the model card is malformed: it nests lists and objects more than {MAX_DEPTH} "
            "levels deep"
        )
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        raise CardError(f"the model card is malformed: not JSON ({error})") from None
    if not isinstance(raw, dict):
        raise CardError("the model card is malformed: not a JSON object")
    try:
        card = ModelCard.model_validate(raw)
    except ValidationError as error:
        raise CardError(f"the model card is malformed: {_one_line(error)}") from None
    if card.version not in SUPPORTED_VERSIONS:
        raise CardError(
            f"model card version {card.version} is not supported (supported: {SUPPORTED_VERSIONS})"
        )
    channels = card.input.channels
    if len(card.preprocessing.mean) != channels or len(card.preprocessing.std) != channels:
        raise CardError(
            f"the model card is malformed: preprocessing.mean and preprocessing.std must "
            f"have {channels} values (input.channels)"
        )
    return card, raw
