"""The model card: everything a server needs to use an exported file, stored inside it.

The card is one JSON document in the ONNX model's ``metadata_props`` under the key
:data:`CARD_KEY`; onnxruntime exposes it as ``session.get_modelmeta().custom_metadata_map``. Its
``format`` and ``version`` let a reader refuse a card it does not understand. Fields::

    format, version          "smso-model-card", 1
    classes                  class names in label order (index = logit position)
    input                    name "image", layout "NCHW", dtype "float32", channels, height, width,
                             dynamic_size (whether H and W may differ from height and width)
    preprocessing            colour "L" or "RGB", resize (the shorter side is resized to this,
                             bilinear with antialiasing; the crop side where training needed no
                             resize), crop (centre crop side), scale 1/255, mean and std per
                             channel: x = (v / 255 - mean) / std
    outputs                  logits (N, K) and embedding (N, p)
    model                    backbone, head, head_options, reduce_dim, embedding_dim (p), form
                             (the SMSO head's form in the graph, "conv" or "covariance"; null
                             for other heads), form_choice (SMSO only, else null: form,
                             requested ("conv", "covariance" or "auto"), positions n at the
                             input size, multiply_adds per image modelled for "conv" and
                             "covariance")
    dataset                  the training dataset's name
    served                   name and version a server serves the model under (the name in
                             /v2/models/{name}): smso-export --name and --version, by default
                             <dataset>-<backbone>-<head> and the checkpoint's sha256[:12]
    metrics                  epoch, val_accuracy, test_accuracy, test_images (null when unknown)
    checkpoint               file name and sha256 of the checkpoint the file was made from
    export                   opset, precision ("float32", or "float16": backbone in float16, head
                             and classifier in float32), optimized (whether onnxruntime's offline
                             optimisation ran: never for float16), exported_at
    parity                   the checks run at export (see export.parity)
    versions                 torch, torchvision, onnx, onnxruntime, python, smso

This module needs neither torch nor onnxruntime: it only builds and serialises the dictionary.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from modelcard import CARD_FORMAT, CARD_KEY, CARD_VERSION

__all__ = [
    "CARD_FORMAT",
    "CARD_KEY",
    "CARD_VERSION",
    "SERVED_NAME",
    "card_from_proto",
    "card_json",
    "check_served_name",
    "file_sha256",
]

#: A served name or version: one URL path segment without escaping (KServe's and Triton's
#: clients put both in /v2/models/{name}/versions/{version}).
SERVED_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def check_served_name(value: str, what: str) -> str:
    """``value`` if it is a valid served name or version, else ``ValueError`` saying why."""
    if not SERVED_NAME.fullmatch(value) or value in (".", ".."):
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
    """The card stored in ``model.metadata_props`` (an ``onnx.ModelProto``), parsed.

    ``KeyError`` naming :data:`CARD_KEY` when the file holds no card.
    """
    for prop in model.metadata_props:
        if prop.key == CARD_KEY:
            card: dict[str, Any] = json.loads(prop.value)
            return card
    raise KeyError(f"the ONNX model has no {CARD_KEY!r} in its metadata_props")


def card_json(card: dict[str, Any]) -> str:
    """The card as compact, key-sorted JSON, with its format and version stamped in."""
    stamped = {"format": CARD_FORMAT, "version": CARD_VERSION, **card}
    return json.dumps(stamped, sort_keys=True, separators=(",", ":"))
