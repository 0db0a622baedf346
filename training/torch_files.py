"""Reading a file that ``torch.save`` wrote, as data only, with one line saying why it cannot be.

Checkpoints (``training.checkpoint``) and pretrained weights (``training.backbones``) are read
here with ``weights_only=True``: loading never runs code from the file. torch's own errors for a
file that is not its format, or is cut short, run to a dozen lines of advice about trusting the
file (including ``weights_only=False``, which must not be followed for a file of unknown origin);
:class:`TorchFileError` keeps the line that names the problem, and each caller says what
file it expected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["NotATorchFileError", "TorchFileError", "read_torch_file"]


class TorchFileError(ValueError):
    """A file that ``torch.load`` cannot read as data: corrupt, truncated, or holding objects
    other than tensors and plain containers. The message is the reason, without the path."""


class NotATorchFileError(TorchFileError):
    """A file that does not start as a ``torch.save`` file does (a zip archive or a pickle):
    empty, or another format. The message completes "it ...": ``is empty``, ``starts with
    b'...'``."""

    def __init__(self, reason: str, onnx: bool = False) -> None:
        super().__init__(reason)
        #: it looks like an ONNX model (smso-export's output), not like a checkpoint
        self.onnx = onnx


def read_torch_file(path: Path, map_location: str = "cpu") -> Any:
    """What ``torch.save`` wrote to the file ``path``, read with ``weights_only=True``.

    Raises:
        NotATorchFileError: it is empty or does not start as a torch.save file does.
        TorchFileError: torch cannot read it (corrupt, truncated, code in its pickle).
        OSError: it cannot be opened (the caller checks that it is a file).
    """
    with path.open("rb") as f:
        head = f.read(4)
    if not head.startswith((b"PK\x03\x04", b"\x80")):  # torch.save's zip archive, or a pickle
        if not head:
            raise NotATorchFileError("is empty")
        onnx = path.suffix.lower() == ".onnx" or head.startswith(b"\x08")  # an ONNX protobuf
        like = ", like an ONNX model (smso-export's output)" if onnx else ""
        raise NotATorchFileError(f"starts with {head!r}{like}", onnx)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # zipfile, pickle and EOF errors all mean "not a valid file"
        raise TorchFileError(_reason(exc)) from exc


def _reason(exc: Exception) -> str:
    """torch's error in one line: what the weights-only unpickler refused, or the first
    sentence of any other error (torch's zip errors go on with advice)."""
    message = str(exc).strip()
    if "WeightsUnpickler error:" in message:
        detail = message.split("WeightsUnpickler error:", 1)[1].strip().splitlines()
        # its first sentence: the advice after it is for files one trusts
        first = detail[0].split(". ", 1)[0] if detail else "unknown"
        return f"its contents do not unpickle as data ({first})"
    reason = (message.splitlines() or [""])[0].split(". ", 1)[0][:200]
    if not any(ch.isalpha() for ch in reason):  # e.g. a KeyError's bare 101, an empty EOFError
        reason = f"{type(exc).__name__} {reason}".strip()
    return reason
