"""Checkpoints that rebuild their own model: the model config travels with the weights.

A checkpoint is a ``torch.save`` dict::

    {"format": "smso-checkpoint", "version": 1,
     "model_config": ModelConfig.to_dict(), "model_state": state_dict, **extra}

``extra`` holds what training adds (optimizer, scheduler, epoch, RNG states, metrics). Files are
written to a temporary name and renamed, so an interrupted save never leaves a half-written file.
They are read with ``weights_only=True``: loading never runs code from the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from training.model import ModelConfig, SecondOrderNet

__all__ = [
    "CheckpointError",
    "held_val_accuracy",
    "load_backbone",
    "load_checkpoint",
    "load_model",
    "resave_checkpoint",
    "save_checkpoint",
    "write_atomically",
]

FORMAT = "smso-checkpoint"
VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupt, or does not match the model it describes."""


def save_checkpoint(path: str | os.PathLike[str], model: SecondOrderNet, **extra: Any) -> Path:
    """Write ``model`` (config, weights) and ``extra`` to ``path`` atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "model_config": model.config.to_dict(),
        "model_state": model.state_dict(),
        **extra,
    }
    write_atomically(path, lambda tmp: torch.save(payload, tmp))
    return path


def resave_checkpoint(
    path: str | os.PathLike[str], model: SecondOrderNet, payload: dict[str, Any], **changes: Any
) -> Path:
    """Write ``model`` to ``path`` with the extra entries of ``payload`` (a loaded checkpoint of
    the same model), ``changes`` added or replacing them; returns the path."""
    if payload.get("model_config") != model.config.to_dict():
        raise CheckpointError(f"{path}: the payload describes another model than the one to save")
    own = ("format", "version", "model_config", "model_state")
    extra = {k: v for k, v in payload.items() if k not in own}
    return save_checkpoint(path, model, **{**extra, **changes})


def held_val_accuracy(payload: dict[str, Any]) -> float | None:
    """The validation accuracy of what a checkpoint holds: after a re-estimate of SMSO's
    Sigma, the one measured with the re-estimate if it was kept, else the one measured without
    it (what the checkpoint kept: the epoch's Sigma, or an earlier re-estimate); without one,
    its epoch's (``val_accuracy``)."""
    recalibration = payload.get("recalibration")
    if isinstance(recalibration, dict):
        kept = recalibration.get("kept")
        return float(recalibration["val_accuracy_after" if kept else "val_accuracy_before"])
    value = payload.get("val_accuracy")
    return None if value is None else float(value)


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` to a temporary name beside ``path``, then rename it to ``path``: an
    interrupted or failed write never leaves a half-written file (nor touches an old one)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(path: str | os.PathLike[str], map_location: str = "cpu") -> dict[str, Any]:
    """Read and validate a checkpoint dict; ``CheckpointError`` says what is wrong with it."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a folder, not a checkpoint file (.pt)")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    with path.open("rb") as f:
        head = f.read(4)
    if not head.startswith((b"PK\x03\x04", b"\x80")):  # torch.save's zip archive, or a pickle
        what = "is empty" if not head else f"starts with {head!r}"
        if path.suffix.lower() == ".onnx" or head.startswith(b"\x08"):  # an ONNX protobuf
            what += (
                ", like an ONNX model (smso-export's output); give the .pt checkpoint that "
                "smso-train wrote, such as runs/NAME/best.pt"
            )
        raise CheckpointError(f"{path} is not a PyTorch checkpoint file: it {what}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # zipfile, pickle and EOF errors all mean "not a valid file"
        # torch's weights-only errors run to a dozen lines of advice about trusting the file:
        # keep the first line, which names the problem
        message = str(exc).strip()
        if "WeightsUnpickler error:" in message:
            detail = message.split("WeightsUnpickler error:", 1)[1].strip().splitlines()
            reason = f"its contents do not unpickle as data ({detail[0] if detail else 'unknown'})"
        else:  # its first sentence (torch's zip errors go on with advice)
            reason = (message.splitlines() or [""])[0].split(". ", 1)[0][:200]
            if not any(ch.isalpha() for ch in reason):  # e.g. a KeyError's bare 101
                reason = f"{type(exc).__name__} {reason}".strip()
        raise CheckpointError(
            f"{path} is not a readable checkpoint (corrupt, truncated or not written by "
            f"smso-train): {reason}"
        ) from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an SMSO checkpoint (no '{FORMAT}' format marker)")
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"{path} has checkpoint version {payload.get('version')}, this code reads {VERSION}"
        )
    for key in ("model_config", "model_state"):
        if not isinstance(payload.get(key), dict):
            raise CheckpointError(f"{path} lacks its {key!r} entry")
    return payload


def load_model(
    path: str | os.PathLike[str], map_location: str = "cpu"
) -> tuple[SecondOrderNet, dict[str, Any]]:
    """Rebuild the model a checkpoint describes and load its weights; returns (model, payload).

    The model is returned in eval mode on ``map_location``.
    """
    payload = load_checkpoint(path, map_location)
    try:
        config = ModelConfig.from_dict(payload["model_config"])
        model = SecondOrderNet(config, load_pretrained=False)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path} holds an invalid model config: {exc}") from exc
    try:
        model.load_state_dict(payload["model_state"], strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()
        raise CheckpointError(
            f"{path}: weights do not match the model its config describes: {' '.join(first[:3])}"
        ) from exc
    return model.to(map_location).eval(), payload


def load_backbone(model: SecondOrderNet, path: str | os.PathLike[str]) -> None:
    """Start ``model``'s backbone from the backbone of the checkpoint at ``path``, a run with the
    same backbone and any head (the paper starts LRBP from BP's fine-tuned weights).

    Only ``backbone.*`` weights are copied; ``CheckpointError`` when they do not fit.
    """
    payload = load_checkpoint(path)
    source = payload["model_config"].get("backbone")
    if source != model.config.backbone:
        raise CheckpointError(
            f"{path} holds a {source!r} backbone, this model has {model.config.backbone!r}"
        )
    prefix = "backbone."
    state = {
        key.removeprefix(prefix): value
        for key, value in payload["model_state"].items()
        if key.startswith(prefix)
    }
    try:
        model.backbone.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()
        raise CheckpointError(
            f"{path}: its backbone weights do not fit this model's: {' '.join(first[:3])}"
        ) from exc
