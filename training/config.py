"""The training run's configuration: one frozen dataclass, from defaults, a file and the CLI.

Precedence: dataclass defaults < config file (``--config run.toml`` or ``.json``) < command-line
flags. ``resolve()`` fills in the recipe's defaults that depend on other fields (learning rate by
backbone, the small CNN's widths, the loss by head, the validation hold-out by dataset), so the
saved ``config.json`` states every value the run used.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tomllib
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.backbones import BACKBONES
from training.datasets import DATASETS
from training.datasets.fashion_mnist import CLASSES, VAL_SIZE, check_classes
from training.heads import HEADS, head_spec
from training.help_formatter import HelpFormatter
from training.model import ModelConfig
from training.runtime import DEVICES

__all__ = [
    "FASHION_MNIST_VAL_SIZE",
    "LR_BY_BACKBONE",
    "SMALL_CNN_WIDTH",
    "ConfigError",
    "TrainConfig",
    "build_parser",
    "parse_train_config",
]

#: The paper's learning rates (fine-tuning from ImageNet weights), and the shipped Fashion-MNIST
#: model's for the small CNN from scratch (0.05 made it diverge on a few hundred images).
LR_BY_BACKBONE = {"vgg16": 0.001, "resnet50": 0.01, "resnet18": 0.01, "small_cnn": 0.01}
#: The small CNN's reduction width c and SMSO dimension p when not given: the shipped model's.
#: The paper's (c = 256, p = 2,048) suit VGG and ResNet features; on the small CNN's 128 channels
#: p = 2,048 standardised outputs make the logits and their gradients so large that a few hundred
#: images diverge (train loss 4 -> 35 at lr 0.05, 130 in the first epoch at 0.01).
SMALL_CNN_WIDTH = 64
#: Fashion-MNIST's validation images held out of its 60,000 training images when not given.
FASHION_MNIST_VAL_SIZE = VAL_SIZE
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
    val_size: int | None = None  # Fashion-MNIST's held-out validation images (None: 5,000)
    classes: list[int] | None = None  # Fashion-MNIST's labels (0-9) kept; None: all ten
    image_size: int | None = None  # input crop side; None: the dataset preset's
    # model
    backbone: str = "small_cnn"  # key of training.backbones.BACKBONES
    head: str = "smso"  # key of training.heads.HEADS
    head_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"dim": 64}
    reduce_dim: int | str | None = "paper"  # 1x1 conv width; "paper": see _HELP
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
    random_erasing: float = 0.0  # probability of erasing a random rectangle of a training image
    ema: float | None = None  # decay of an exponential moving average of the weights; None: off
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
            (
                self.lr is None or (math.isfinite(self.lr) and self.lr > 0),
                "lr must be a finite number > 0",
            ),
            (
                math.isfinite(self.new_layer_lr_mult) and self.new_layer_lr_mult > 0,
                "new_layer_lr_mult must be a finite number > 0",
            ),
            (0 <= self.momentum < 1, "momentum must be in [0, 1)"),
            (
                math.isfinite(self.weight_decay) and self.weight_decay >= 0,
                "weight_decay must be a finite number >= 0",
            ),
            (0 < self.plateau_factor < 1, "plateau_factor must be in (0, 1)"),
            (self.plateau_patience >= 0, "plateau_patience must be >= 0"),
            (self.seed >= 0, "seed must be >= 0"),
            (self.schedule in SCHEDULES, f"schedule must be one of {', '.join(SCHEDULES)}"),
            (self.loss in LOSSES, f"loss must be one of {', '.join(LOSSES)}"),
            (self.amp in AMP_MODES, f"amp must be one of {', '.join(AMP_MODES)}"),
            (self.workers >= 0, "workers must be >= 0"),
            (self.stop_after is None or self.stop_after >= 1, "stop_after must be >= 1 or null"),
            (
                self.image_size is None
                or self.backbone not in BACKBONES
                or self.image_size >= BACKBONES[self.backbone].stride,
                f"image_size must be at least the {self.backbone} backbone's stride "
                f"({BACKBONES[self.backbone].stride if self.backbone in BACKBONES else '?'} px: "
                f"one position of its feature map), got {self.image_size}",
            ),
            (0 <= self.label_smoothing < 1, "label_smoothing must be in [0, 1)"),
            (0 <= self.random_erasing <= 1, "random_erasing must be in [0, 1]"),
            (self.ema is None or 0 <= self.ema < 1, "ema must be in [0, 1) or null"),
            (
                self.reduce_dim is None
                or self.reduce_dim == "paper"
                or (isinstance(self.reduce_dim, int) and self.reduce_dim >= 1),
                "reduce_dim must be a positive integer, 'paper' or null",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        if self.classes is not None:
            if self.dataset != "fashion_mnist":
                raise ConfigError(
                    f"classes (a subset of the labels) is read by fashion_mnist only, not "
                    f"{self.dataset}: leave it out, or give your own images a folder per class"
                )
            try:
                check_classes(self.classes)
            except ValueError as error:
                raise ConfigError(str(error)) from None

    def model_config(self, num_classes: int, in_channels: int) -> ModelConfig:
        """The model this run trains (raises for unknown backbone or head names)."""
        options = dict(self.head_options)
        if self.reduce_dim == "paper":
            return ModelConfig.for_paper(
                self.backbone,
                self.head,
                num_classes,
                head_options=options,
                in_channels=in_channels,
                pretrained=self.pretrained,
            )
        return ModelConfig(
            num_classes=num_classes,
            backbone=self.backbone,
            head=self.head,
            head_options=options,
            reduce_dim=self.reduce_dim,  # type: ignore[arg-type]
            in_channels=in_channels,
            pretrained=self.pretrained,
        )

    @property
    def learning_rate(self) -> float:
        """``lr``, or where it is not given, the recipe's for the backbone (``LR_BY_BACKBONE``)."""
        return self.lr if self.lr is not None else LR_BY_BACKBONE.get(self.backbone, 0.01)

    def resolve(self) -> TrainConfig:
        """The same config with every recipe default made explicit: the lr by backbone, the
        small CNN's widths, the loss from the head's spec, ``val_size`` where the dataset reads
        it (None elsewhere: the run's ``splits.json`` says how its validation split was made).
        Raises ``UnknownHeadError`` for an unknown head."""
        lr = self.learning_rate
        spec = head_spec(self.head)
        loss = spec.loss if self.loss == "auto" else self.loss
        reduce_dim, options = self.reduce_dim, dict(self.head_options)
        if self.backbone == "small_cnn":
            if reduce_dim == "paper":  # the first-order head keeps the backbone's channels
                reduce_dim = None if spec.paper_channels is None else SMALL_CNN_WIDTH
            if spec.small_cnn_dim_is_width:
                options.setdefault("dim", SMALL_CNN_WIDTH)
        val_size = None
        if self.dataset == "fashion_mnist":
            val_size = FASHION_MNIST_VAL_SIZE if self.val_size is None else self.val_size
        return dataclasses.replace(
            self, lr=lr, loss=loss, reduce_dim=reduce_dim, head_options=options, val_size=val_size
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown setting(s): {', '.join(unknown)}; "
                f"valid settings: {', '.join(sorted(known))}"
            )
        _check_types(data)
        return cls(**data)


def _read_file(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder: give a TOML or JSON file")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except UnicodeDecodeError:
        raise ConfigError(
            f"cannot parse config file {path}: it is not text (UTF-8); give a TOML or JSON file"
        ) from None
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
    return _json_object if typing.get_origin(base) is dict else base


def _json_object(text: str) -> dict[str, Any]:
    """A flag's JSON object, or argparse's one-line error saying what it must look like."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(
            f"not JSON ({error.msg} at character {error.pos}): {text!r}; give an object such as "
            """'{"dim": 64}'"""
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object such as '{\"dim\": 64}'")
    return value


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


def _imagenet_backbones() -> str:
    return ", ".join(name for name, spec in BACKBONES.items() if spec.imagenet is not None)


#: The help of each setting's flag; "(default: ...)" is added where the default is a value.
_HELP = {
    "dataset": "the dataset and its layout; image_folder: your own images in "
    "DATA_ROOT/train/<class>/ and DATA_ROOT/test/<class>/ (optional val/<class>/), classes "
    "named by the folders in sorted order",
    "data_root": "the dataset's folder (default: Debian's Fashion-MNIST for fashion_mnist; "
    "required for the others)",
    "partition": "DTD's partition 1-10, MINC-2500's split 1-5; 1 for the other datasets",
    "val_size": "Fashion-MNIST only: training images held out for validation (default: "
    f"{FASHION_MNIST_VAL_SIZE:,}). image_folder uses val/ when it exists, else holds out 10%% "
    "of each class of train/, as MIT-Indoor and CUB-200 do; DTD and MINC-2500 use their own "
    "validation lists. splits.json in the run folder records what was done",
    "classes": "Fashion-MNIST only: the labels to train and test on, e.g. '--classes 0 1 2 3 "
    "4 5 8 9' (Shirt and Sneaker held out); relabelled 0..K-1 in label order (default: all "
    "ten: " + ", ".join(f"{i} {name}" for i, name in enumerate(CLASSES)) + ")",
    "image_size": "side of the square crop the model sees, in pixels (default: the dataset's: "
    "28 Fashion-MNIST, 224 image_folder and MINC-2500, 448 the others); 32 or 64 suit the "
    "small CNN",
    "backbone": "the convolutional trunk; small_cnn trains from scratch in minutes on a CPU, "
    "the others want ImageNet weights (--pretrained) and a GPU",
    "head": "the pooling head: smso is this project's, the others the paper's baselines",
    "head_options": "the head's options as JSON, e.g. '{\"dim\": 64}' for SMSO's p (default: "
    f"the head's own; SMSO on small_cnn: p = {SMALL_CNN_WIDTH})",
    "reduce_dim": "channels c of the 1x1 conv before the head, an integer, 'paper' (512 for "
    f"BP, DeepO2P and CBP, 256 for the others; {SMALL_CNN_WIDTH} on small_cnn) or 'none' (no "
    "conv)",
    "pretrained": "backbone weights: 'imagenet' (torchvision's, downloaded once; "
    f"{_imagenet_backbones()}) or a local .pt/.pth file of the torchvision model's or the "
    "backbone's state dict (default: random initialisation)",
    "init_from": "a checkpoint whose backbone weights start this run (LRBP from BP's)",
    "epochs": "passes over the training images",
    "batch_size": "images per step (per process under torchrun)",
    "lr": "SGD learning rate (default: by backbone: "
    + ", ".join(f"{k} {v:g}" for k, v in LR_BY_BACKBONE.items())
    + "); lower it if the loss grows or becomes NaN",
    "new_layer_lr_mult": "learning-rate multiplier for the new layers (1x1 conv, head, classifier)",
    "momentum": "SGD momentum",
    "weight_decay": "L2 weight decay (not on biases and 1-d parameters)",
    "schedule": "plateau: lr x plateau-factor after plateau-patience epochs without a lower "
    "validation loss (the paper's); cosine: cosine decay to 0 over the run",
    "plateau_patience": "epochs without a lower validation loss before the lr drops",
    "plateau_factor": "what the lr is multiplied by when it drops",
    "loss": "the training loss; auto: the head's own (hinge for LRBP, else cross_entropy)",
    "label_smoothing": "cross-entropy label smoothing in [0, 1)",
    "random_erasing": "probability in [0, 1] of setting a random rectangle (2-33 %% of the crop, "
    "aspect 0.3-3.3) of a training image to the mean (Zhong et al., 2020); 0: off",
    "ema": "decay d in [0, 1) of an exponential moving average of the weights and buffers, "
    "updated after every step (w_ema = d w_ema + (1 - d) w): validation, best.pt and the test "
    "use the average (default: off, the trained weights)",
    "device": DEVICES,
    "amp": "mixed precision: auto (bf16 where the GPU supports it, else fp16; off on a CPU), "
    "bf16, fp16 or off (float32)",
    "channels_last": "channels-last memory layout (faster convolutions on GPUs)",
    "workers": "data-loading processes per training process (0: load in the main process)",
    "seed": "seed of the initialisation, the data order and the validation hold-out",
    "out": "the run folder: config.json, splits.json, metrics.jsonl, last.pt, best.pt, test.json",
    "resume": "continue the run in --out from its last.pt",
    "stop_after": "stop after this epoch, to --resume later (default: run every epoch)",
    "eval_test": "evaluate best.pt on the test split at the end (test.json)",
    "recalibrate": "at the end, re-estimate SMSO's Sigma in best.pt over the training images",
}
_CHOICES = {
    "dataset": sorted(DATASETS),
    "backbone": list(BACKBONES),
    "head": list(HEADS),
    "schedule": SCHEDULES,
    "loss": LOSSES,
    "amp": AMP_MODES,
}


def build_parser() -> argparse.ArgumentParser:
    """``smso-train``'s parser: a flag per setting, each with its help."""
    parser = argparse.ArgumentParser(
        prog="smso-train",
        description="Train an SMSO model (or a baseline head) with the paper's recipe. "
        "Settings: the defaults below, then --config, then flags; the run folder's config.json "
        "records every value used.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="a TOML or JSON file of settings, named as "
        "the flags below with _ for - (configs/ holds examples)",
    )
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        # SUPPRESS: a flag not given leaves the config file's value (or the dataclass's), and a
        # flag given as 'none' (--reduce-dim none) overrides the file's value with None
        if typing.get_origin(_optional(hints[f.name])) is list:
            parser.add_argument(
                flag,
                nargs="+",
                type=int,
                default=argparse.SUPPRESS,
                metavar="LABEL",
                help=_flag_help(f.name, default),
            )
        elif hints[f.name] is bool:
            parser.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=_flag_help(f.name, default),
            )
        else:
            parser.add_argument(
                flag,
                type=_parser_type(f.name, hints[f.name]),
                default=argparse.SUPPRESS,
                help=_flag_help(f.name, default),
            )
    return parser


def _flag_help(name: str, default: Any) -> str:
    """The setting's help, its valid values (checked where the config is used, so a wrong one
    is one error line) and its default where it is a value the help does not already give."""
    text = _HELP[name]
    if name in _CHOICES:
        text += f"; one of: {', '.join(_CHOICES[name])}"
    if default is not None and default != {} and "(default:" not in text:
        shown = ("on" if default else "off") if isinstance(default, bool) else default
        text += f" (default: {shown})"
    return text


#: The settings that name a file or folder, and what each accepts: an empty one would be the
#: current folder (a run written among the user's files) or "file . does not exist".
_PATHS = {
    "data_root": "give the dataset's folder, or leave it out for the default",
    "out": "give the run's folder, such as runs/NAME",
    "pretrained": "give 'imagenet' or a weights file, or leave it out for random initialisation",
    "init_from": "give a checkpoint written by smso-train, or leave it out",
}


def parse_train_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """Build the config from ``--config`` and flags; raise ``ConfigError`` on a bad setting."""
    args = vars(build_parser().parse_args(argv))
    path = args.pop("config")
    data = _read_file(path) if path else {}
    data.update(args)
    # checked here, not in TrainConfig: a stored config of an older run may hold "" (then the
    # current folder) and must still load
    for name, accepted in _PATHS.items():
        if isinstance(data.get(name), str) and not data[name].strip():
            raise ConfigError(f"{name} is empty: {accepted}")
    return TrainConfig.from_dict(data)
