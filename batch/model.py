"""The model file a job runs: read once by the driver, checked, and shipped to every actor.

The driver reads the ONNX file's bytes (a local path or a URI), checks that onnxruntime loads it
and that it carries a model card (the service's :func:`service.runtime.backend.read_card`), and
puts the bytes into Ray's object store: actors on any node of a cluster get the same file,
whether or not the driver's path exists there. The file is known by the sha256 of its bytes,
which OUT's manifest records: another graph carrying the same card is another model.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from batch.inputs import InputError, locate, utf8_path
from service.core.card import ModelCard
from service.runtime.backend import read_card

__all__ = ["ModelError", "ModelFile", "load_model_file"]


class ModelError(ValueError):
    """MODEL is missing, unreadable, not an ONNX file, or has no usable model card."""


@dataclass(frozen=True)
class ModelFile:
    """An exported model: its bytes, its card, and what names it in every output row."""

    data: bytes  # the ONNX file, as written by smso-export
    card: ModelCard
    card_sha256: str  # sha256 of the card (canonical JSON: sorted keys, no spaces)
    sha256: str  # sha256 of the file's bytes: what a resume checks (a card can be copied)
    source: str  # MODEL as the job found it (an absolute path or a URI), for messages

    @property
    def name(self) -> str:
        return self.card.name

    @property
    def version(self) -> str:
        return self.card.model_version

    @property
    def has_typicality(self) -> bool:
        """Whether the card has a typicality reference (the score and p-value are written)."""
        return self.card.typicality is not None


def load_model_file(target: str) -> ModelFile:
    """MODEL's bytes and card; :class:`ModelError` with a one-line reason otherwise."""
    try:
        utf8_path(target)
        location = locate(target)
        info = location.filesystem.get_file_info(location.path)
        if info.type == pafs.FileType.NotFound:
            raise ModelError(f"{target}: no such model file")
        if info.type != pafs.FileType.File:
            raise ModelError(f"{target}: not a file (give the .onnx file smso-export wrote)")
        with location.filesystem.open_input_stream(location.path) as stream:
            data = stream.read()
    except InputError as error:
        raise ModelError(str(error)) from None
    except OSError as error:
        raise ModelError(f"{target}: cannot be read ({error})") from None
    folder = tempfile.mkdtemp(prefix="smso-embed-")
    path = Path(folder) / "model.onnx"
    try:
        path.write_bytes(data)
        card = read_card(path)
    except ValueError as error:  # CardError too: no card, a malformed one, another version
        raise ModelError(str(error).replace(str(path), target)) from None
    finally:
        path.unlink(missing_ok=True)
        os.rmdir(folder)
    source = location.uri(location.path)
    return ModelFile(data, card, card.sha256(), hashlib.sha256(data).hexdigest(), source)
