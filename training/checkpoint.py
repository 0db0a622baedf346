"""Checkpoints that rebuild their own model: the model config travels with the weights.

A checkpoint is a ``torch.save`` dict::

    {"format": "smso-checkpoint", "version": 1,
     "model_config": ModelConfig.to_dict(), "model_state": state_dict, **extra}

``extra`` holds what training adds (optimizer, scheduler, epoch, RNG states, metrics) and what
the model's outputs are (``classes``: one name per output, in order). Files are written to a
temporary name and renamed (``training.outputs.write_atomically``), so an interrupted save never
leaves a half-written file. They are read with ``weights_only=True``
(``training.torch_files``): loading never runs code from the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from training.heads import head_spec
from training.model import ModelConfig, SecondOrderNet
from training.outputs import write_atomically
from training.torch_files import NotATorchFileError, TorchFileError, read_torch_file

__all__ = [
    "CheckpointError",
    "check_finite",
    "held_val_accuracy",
    "is_checkpoint",
    "load_backbone",
    "load_checkpoint",
    "load_model",
    "resave_checkpoint",
    "save_checkpoint",
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
    write_atomically(path, lambda file: torch.save(payload, file))
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


def load_checkpoint(path: str | os.PathLike[str], map_location: str = "cpu") -> dict[str, Any]:
    """Read and validate a checkpoint dict; ``CheckpointError`` says what is wrong with it."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a folder, not a checkpoint file (.pt)")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        payload = read_torch_file(path, map_location)
    except NotATorchFileError as error:
        advice = (
            "; give the .pt checkpoint that smso-train wrote, such as runs/NAME/best.pt"
            if error.onnx
            else ""
        )
        raise CheckpointError(
            f"{path} is not a PyTorch checkpoint file: it {error}{advice}"
        ) from error
    except TorchFileError as error:
        raise CheckpointError(
            f"{path} is not a readable checkpoint (corrupt, truncated or not written by "
            f"smso-train): {error}"
        ) from error
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
    _check_classes(path, payload, config.num_classes)
    return model.to(map_location).eval(), payload


def _check_classes(path: str | os.PathLike[str], payload: dict[str, Any], outputs: int) -> None:
    """``CheckpointError`` unless the checkpoint's ``classes``, where it has them, name each of
    its model's ``outputs`` (a model card and ``smso-eval`` take the names from there)."""
    classes = payload.get("classes")
    if classes is None:
        return
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise CheckpointError(
            f"{path}: its 'classes' entry must be a list of class names (strings), got "
            f"{type(classes).__name__}"
        )
    if len(classes) != outputs:
        raise CheckpointError(
            f"{path} names {len(classes)} classes for the {outputs} outputs of its model: a "
            "checkpoint names every output, in order (smso-train writes it so); this one was "
            "changed or not written by smso-train"
        )


def is_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether the file ``path`` holds an SMSO checkpoint (which a tool may write over: an
    earlier output of its own, never a user's other file)."""
    try:
        load_checkpoint(path)
    except (CheckpointError, OSError):
        return False
    return True


def check_finite(model: SecondOrderNet, path: str | os.PathLike[str]) -> None:
    """``CheckpointError`` when the weights or buffers the checkpoint at ``path`` gave
    ``model`` hold NaN or infinite values: every output would be NaN, so an accuracy measured
    or a model exported from it would mean nothing. The message names them and the way out:
    ``smso-recalibrate`` where only the statistics a head re-estimates after training are
    broken (SMSO's Sigma), else training again."""
    broken = [
        f"{name} ({int((~torch.isfinite(tensor)).sum())} of {tensor.numel()})"
        for name, tensor in model.state_dict().items()
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())
    ]
    if not broken:
        return
    statistics = {f"head.{name}" for name, _ in model.head.named_buffers()}
    re_estimated = head_spec(model.config.head).input_statistics == "after_training"
    if re_estimated and all(entry.split(" ", 1)[0] in statistics for entry in broken):
        fix = f"the head re-estimates them from the training images: run smso-recalibrate {path}"
    else:
        fix = "the run that wrote it diverged: train again with a lower learning rate (lr)"
    shown = ", ".join(broken[:3]) + (f" and {len(broken) - 3} more" if len(broken) > 3 else "")
    raise CheckpointError(
        f"{path} holds NaN or infinite values in {shown}: the model's outputs would be NaN; {fix}"
    )


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
