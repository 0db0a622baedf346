"""The training run's configuration: one frozen dataclass, from defaults, a file and the CLI.

Precedence: dataclass defaults < config file (``--config run.toml`` or ``.json``) < command-line
flags. ``resolve()`` fills in the recipe's defaults that depend on other fields (learning rate by
backbone, the paper's reduction width by head, the loss by head), so the saved ``config.json``
states every value the run used.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tomllib
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.heads import head_spec
from training.model import ModelConfig

__all__ = ["LR_BY_BACKBONE", "ConfigError", "TrainConfig", "parse_train_config"]

#: The paper's learning rates (fine-tuning from ImageNet weights), and one for the small CNN.
LR_BY_BACKBONE = {"vgg16": 0.001, "resnet50": 0.01, "resnet18": 0.01, "small_cnn": 0.05}
SCHEDULES = ("plateau", "cosine")
LOSSES = ("auto", "cross_entropy", "hinge")
AMP_MODES = ("auto", "bf16", "fp16", "off")


class ConfigError(ValueError):
    """A setting that is unknown, of the wrong type or out of range."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs; saved as ``config.json`` beside its checkpoints."""

    # data
    dataset: str = "fashion_mnist"  # key of training.datasets.DATASETS
    data_root: str | None = None  # dataset folder; None: Debian's Fashion-MNIST (others need one)
    partition: int = 1  # DTD's partition 1-10, MINC-2500's split 1-5
    val_size: int = 5000  # Fashion-MNIST: images held out of the training set for validation
    image_size: int | None = None  # input crop side; None: the dataset preset's
    # model
    backbone: str = "small_cnn"  # key of training.backbones.BACKBONES
    head: str = "smso"  # key of training.heads.HEADS
    head_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"dim": 64}
    reduce_dim: int | str | None = "paper"  # 1x1 conv width; "paper": 512 BP/DeepO2P/CBP, 256 else
    pretrained: str | None = None  # "imagenet", a weights file, or None (random init)
    init_from: str | None = None  # a checkpoint whose backbone starts the run (LRBP from BP's)
    # optimisation (the paper: SGD with momentum, lr / 10 after 8 epochs without a better val loss)
    epochs: int = 30
    batch_size: int = 32  # per process
    lr: float | None = None  # None: LR_BY_BACKBONE
    new_layer_lr_mult: float = 1.0  # lr multiplier for the new layers (1x1 conv, head, classifier)
    momentum: float = 0.9
    weight_decay: float = 5e-4
    schedule: str = "plateau"  # "plateau" (the paper) or "cosine"
    plateau_patience: int = 8  # epochs without a lower validation loss before lr / 10
    plateau_factor: float = 0.1
    loss: str = "auto"  # "cross_entropy", "hinge" (LRBP's), or "auto": the head's own
    label_smoothing: float = 0.0
    # runtime
    device: str = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
    amp: str = "auto"  # "auto" (bf16 where supported, else fp16; off on CPU), "bf16", "fp16", "off"
    channels_last: bool = True
    workers: int = 2  # data-loading processes per training process
    seed: int = 0
    out: str = "runs/default"  # run folder: config.json, metrics.jsonl, last.pt, best.pt
    resume: bool = False  # continue from out/last.pt
    stop_after: int | None = None  # stop after this epoch (resume later); None: run all epochs
    eval_test: bool = True  # evaluate best.pt on the test split at the end
    recalibrate: bool = (
        True  # at the end, re-estimate SMSO's Sigma in best.pt over the train images
    )

    def __post_init__(self) -> None:
        checks = [
            (self.epochs >= 1, "epochs must be >= 1"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.lr is None or self.lr > 0, "lr must be > 0"),
            (self.schedule in SCHEDULES, f"schedule must be one of {', '.join(SCHEDULES)}"),
            (self.loss in LOSSES, f"loss must be one of {', '.join(LOSSES)}"),
            (self.amp in AMP_MODES, f"amp must be one of {', '.join(AMP_MODES)}"),
            (self.workers >= 0, "workers must be >= 0"),
            (0 <= self.label_smoothing < 1, "label_smoothing must be in [0, 1)"),
            (
                self.reduce_dim is None or self.reduce_dim == "paper" or
                (isinstance(self.reduce_dim, int) and self.reduce_dim >= 1),
                "reduce_dim must be a positive integer, 'paper' or null",
            ),
        ]  # fmt: skip
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def model_config(self, num_classes: int, in_channels: int) -> ModelConfig:
        """The model this run trains (raises for unknown backbone or head names)."""
        options = dict(self.head_options)
        if self.reduce_dim == "paper":
            return ModelConfig.for_paper(
                self.backbone, self.head, num_classes, head_options=options,
                in_channels=in_channels, pretrained=self.pretrained,
            )  # fmt: skip
        return ModelConfig(
            num_classes=num_classes, backbone=self.backbone, head=self.head,
            head_options=options, reduce_dim=self.reduce_dim,  # type: ignore[arg-type]
            in_channels=in_channels, pretrained=self.pretrained,
        )  # fmt: skip

    def resolve(self) -> TrainConfig:
        """The same config with every recipe default made explicit (the loss from the head's
        spec; raises ``UnknownHeadError`` for an unknown head)."""
        lr = self.lr if self.lr is not None else LR_BY_BACKBONE.get(self.backbone, 0.01)
        loss = head_spec(self.head).loss if self.loss == "auto" else self.loss
        return dataclasses.replace(self, lr=lr, loss=loss)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown setting(s): {', '.join(unknown)}; valid settings: {', '.join(sorted(known))}"
            )
        _check_types(data)
        return cls(**data)


def _read_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot parse config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a table of settings")
    return data


def _optional(hint: Any) -> Any:
    """``X | None`` -> ``X``; any other hint unchanged."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if isinstance(hint, types.UnionType) and len(args) == 1 else hint


def _reduce_dim(text: str) -> int | str | None:
    if text.lower() in ("none", "null"):
        return None
    return int(text) if text.isdigit() else text


def _parser_type(name: str, hint: Any) -> Any:
    """The argparse ``type`` of a field: json for dicts, the plain type otherwise."""
    if name == "reduce_dim":
        return _reduce_dim
    base = _optional(hint)
    return json.loads if typing.get_origin(base) is dict else base


def _check_types(data: dict[str, Any]) -> None:
    """Raise ``ConfigError`` for a value whose type does not fit its field (e.g. from a file)."""
    hints = typing.get_type_hints(TrainConfig)
    for name, value in data.items():
        hint = hints[name]
        allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        allowed = tuple(typing.get_origin(a) or a for a in allowed)
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            continue
        if isinstance(value, bool) and bool not in allowed:
            ok = False
        else:
            ok = isinstance(value, allowed)
        if not ok:
            names = " or ".join("null" if a is type(None) else a.__name__ for a in allowed)
            raise ConfigError(f"setting {name} must be {names}, got {value!r}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="smso-train",
        description="Train an SMSO model (or a baseline head) with the paper's recipe. "
        "Settings: the defaults below, then --config, then flags.",
    )
    parser.add_argument("--config", type=Path, help="TOML or JSON file of settings")
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if hints[f.name] is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                                help=f"(default: {default!r})")  # fmt: skip
        else:
            parser.add_argument(flag, type=_parser_type(f.name, hints[f.name]), default=None,
                                help=f"(default: {default!r})")  # fmt: skip
    return parser


def parse_train_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """Build the config from ``--config`` and flags; raise ``ConfigError`` on a bad setting."""
    args = vars(_parser().parse_args(argv))
    path = args.pop("config")
    data = _read_file(path) if path else {}
    data.update({k: v for k, v in args.items() if v is not None})
    return TrainConfig.from_dict(data)
