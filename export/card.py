"""The model card around export: read back from an ONNX file, and what smso-export checks.

The card is :class:`modelcard.card.ModelCard` (its fields are described there and in
``docs/model-card.md``); it is one JSON document under the key :data:`CARD_KEY`, which
onnxruntime exposes as ``session.get_modelmeta().custom_metadata_map``. This module holds what
export adds around it: reading it back from a ``ModelProto``, the check of a served name that
smso-export makes before any work, and the checkpoint's checksum.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from modelcard import CARD_KEY
from modelcard.card import SERVED_NAME, ModelCard

__all__ = [
    "CARD_KEY",
    "card_from_proto",
    "check_served_name",
    "file_sha256",
]

_SERVED_NAME = re.compile(SERVED_NAME)


def check_served_name(value: str, what: str) -> str:
    """``value`` if it is a valid served name or version, else ``ValueError`` saying why."""
    if not _SERVED_NAME.fullmatch(value) or value in (".", ".."):
        raise ValueError(
            f"{what} {value!r} must be 1 to 128 letters, digits, '_', '.' or '-' (one URL path "
            "segment), and not '.' or '..'"
        )
    return value


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _Entry(Protocol):
    """One ``metadata_props`` entry of an ONNX model (``onnx.StringStringEntryProto``)."""

    @property
    def key(self) -> str: ...

    @property
    def value(self) -> str: ...


class _HasMetadata(Protocol):
    """An ONNX ``ModelProto``, as far as the card needs it."""

    @property
    def metadata_props(self) -> Iterable[_Entry]: ...


def card_from_proto(model: _HasMetadata) -> dict[str, Any]:
    """The card stored in ``model.metadata_props`` (an ``onnx.ModelProto``), read as the
    service reads it (:meth:`ModelCard.from_json`: migrated and checked), as JSON data.

    ``KeyError`` naming :data:`CARD_KEY` when the file holds no card.
    """
    for prop in model.metadata_props:
        if prop.key == CARD_KEY:
            return ModelCard.from_json(prop.value).model_dump(mode="json")
    raise KeyError(f"the ONNX model has no {CARD_KEY!r} in its metadata_props")
