"""The backbone registry: convolutional trunks that give the last feature map ``(B, C, h, w)``.

=========== ============================================== ======= ======== =============
name        what it is                                     C       stride   input
=========== ============================================== ======= ======== =============
vgg16       VGG-D truncated after conv5_3's ReLU           512     16       RGB
resnet50    ResNet-50 without global pooling and FC        2,048   32       RGB
resnet18    ResNet-18 without global pooling and FC        512     32       RGB
small_cnn   5 conv layers for 28x28 single-channel images  128     4        grey, 28 px
=========== ============================================== ======= ======== =============

Pretrained weights: ``pretrained="imagenet"`` takes torchvision's ImageNet weights (from the torch
hub cache, downloading them when there is a network); ``pretrained=PATH`` loads a local file that
holds either the full torchvision model's state dict or the truncated backbone's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torchvision
from torch import Tensor, nn

from training.torch_files import NotATorchFileError, TorchFileError, read_torch_file

__all__ = [
    "BACKBONES",
    "Backbone",
    "BackboneSpec",
    "PretrainedWeightsError",
    "UnknownBackboneError",
    "backbone_spec",
    "create_backbone",
    "pretrained_state",
]

log = logging.getLogger(__name__)


class UnknownBackboneError(ValueError):
    """A backbone name that is not registered."""


class PretrainedWeightsError(RuntimeError):
    """Pretrained weights were asked for but cannot be had or do not fit the backbone."""


class Backbone(nn.Module):
    """A CNN trunk: ``(B, in_channels, H, W)`` -> ``(B, out_channels, H/stride, W/stride)``."""

    def __init__(self, body: nn.Module, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.body = body
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)


def _vgg16_body(model: torchvision.models.VGG) -> nn.Module:
    # features[29] is conv5_3's ReLU; features[30], the last max-pool, is dropped.
    return model.features[:30]


def _resnet_body(model: torchvision.models.ResNet) -> nn.Module:
    return nn.Sequential(
        model.conv1,
        model.bn1,
        model.relu,
        model.maxpool,
        model.layer1,
        model.layer2,
        model.layer3,
        model.layer4,
    )


def _conv_bn_relu(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True)]


class SmallCNN(nn.Sequential):
    """Five 3x3 conv-BN-ReLU layers and two 2x2 max-pools: ``(B, 1, 28, 28)`` -> ``(B, 128, 7, 7)``.

    Small enough to train on Fashion-MNIST in minutes on a laptop CPU; ``n = 49`` positions feed the
    second-order head.
    """

    def __init__(self, in_channels: int = 1) -> None:
        super().__init__(
            *_conv_bn_relu(in_channels, 32),
            *_conv_bn_relu(32, 32),
            nn.MaxPool2d(2),
            *_conv_bn_relu(32, 64),
            *_conv_bn_relu(64, 64),
            nn.MaxPool2d(2),
            *_conv_bn_relu(64, 128),
        )


@dataclass(frozen=True)
class BackboneSpec:
    """How to build one backbone."""

    model: Callable[[], nn.Module]  # the full model, random weights
    body: Callable[[nn.Module], nn.Module]  # the full model -> the truncated trunk
    out_channels: int  # C of the output feature map
    stride: int  # input size / feature map size
    in_channels: int  # image channels the model is made for
    imagenet: Any  # torchvision weights enum entry, or None
    summary: str


def _tv(name: str) -> Callable[[], nn.Module]:
    return lambda: getattr(torchvision.models, name)(weights=None)


BACKBONES: dict[str, BackboneSpec] = {
    "vgg16": BackboneSpec(
        _tv("vgg16"), _vgg16_body, 512, 16, 3,
        torchvision.models.VGG16_Weights.IMAGENET1K_V1, "VGG-D to conv5_3's ReLU",
    ),
    "resnet50": BackboneSpec(
        _tv("resnet50"), _resnet_body, 2048, 32, 3,
        torchvision.models.ResNet50_Weights.IMAGENET1K_V1, "ResNet-50 without pooling and FC",
    ),
    "resnet18": BackboneSpec(
        _tv("resnet18"), _resnet_body, 512, 32, 3,
        torchvision.models.ResNet18_Weights.IMAGENET1K_V1, "ResNet-18 without pooling and FC",
    ),
    "small_cnn": BackboneSpec(
        SmallCNN, lambda m: m, 128, 4, 1, None, "5-layer CNN for 28x28 grey images",
    ),
}  # fmt: skip


def backbone_spec(name: str) -> BackboneSpec:
    """The registry entry for ``name``; ``UnknownBackboneError`` lists the valid names."""
    try:
        return BACKBONES[name]
    except KeyError:
        raise UnknownBackboneError(
            f"unknown backbone {name!r}; valid backbones: {', '.join(sorted(BACKBONES))}"
        ) from None


def create_backbone(
    name: str,
    pretrained: str | os.PathLike[str] | None = None,
    in_channels: int | None = None,
    weights: dict[str, Tensor] | None = None,
) -> Backbone:
    """Build the backbone ``name``.

    Args:
        name: a key of ``BACKBONES``.
        pretrained: None (random init), ``"imagenet"`` (torchvision's weights) or a path to a local
            weights file (the full torchvision model's state dict or the backbone's own).
        in_channels: image channels; defaults to the backbone's own (3, or 1 for ``small_cnn``).
            When it differs, the first convolution is adapted: pretrained RGB filters are summed
            for one channel, or cycled and rescaled for others.
        weights: the state dict ``pretrained`` names, when the caller has already read it.

    Raises:
        UnknownBackboneError: ``name`` is not registered; the message lists the valid names.
        PretrainedWeightsError: weights asked for but unavailable, or not matching the model.
    """
    spec = backbone_spec(name)
    model = spec.model()
    body = spec.body(model)
    if pretrained is not None:
        state = weights if weights is not None else pretrained_state(name, pretrained)
        _load_into(name, model, body, state, str(pretrained))
    in_channels = spec.in_channels if in_channels is None else in_channels
    if in_channels != spec.in_channels:
        _adapt_first_conv(body, in_channels)
    return Backbone(body, in_channels, spec.out_channels, spec.stride)


def pretrained_state(name: str, pretrained: str | os.PathLike[str]) -> dict[str, Tensor]:
    """The state dict ``pretrained`` names for backbone ``name``: torchvision's ImageNet weights
    (``"imagenet"``) or a local file; ``PretrainedWeightsError`` says why it cannot be had."""
    spec = backbone_spec(name)
    if str(pretrained) == "imagenet":
        if spec.imagenet is None:
            raise PretrainedWeightsError(
                f"backbone {name!r} has no ImageNet weights; pass a local weights file instead"
            )
        try:
            return spec.imagenet.get_state_dict(progress=False)
        except (OSError, RuntimeError) as exc:  # URLError is an OSError
            cache = Path(torch.hub.get_dir()) / "checkpoints" / Path(spec.imagenet.url).name
            raise PretrainedWeightsError(
                f"cannot get torchvision's ImageNet weights for {name!r} ({exc}). Download "
                f"{spec.imagenet.url} to {cache}, or pass a local weights file as pretrained"
            ) from exc
    path = Path(pretrained)
    accepted = "give 'imagenet' or a .pt/.pth file of the torchvision model's or the backbone's "
    accepted += "state dict"
    if path.is_dir():
        raise PretrainedWeightsError(f"pretrained weights file {path} is a folder: {accepted}")
    if not path.is_file():
        raise PretrainedWeightsError(f"pretrained weights file {path} does not exist: {accepted}")
    try:
        state = read_torch_file(path)
    except NotATorchFileError as error:
        raise PretrainedWeightsError(
            f"pretrained weights file {path} is not a PyTorch file: it {error}; {accepted}"
        ) from error
    except TorchFileError as error:
        raise PretrainedWeightsError(
            f"cannot read pretrained weights from {path} (corrupt or truncated, or not a state "
            f"dict): {error}; {accepted}"
        ) from error
    if isinstance(state, dict) and "model_config" in state and "model_state" in state:
        raise PretrainedWeightsError(
            f"{path} is a checkpoint written by smso-train, not a state dict of backbone "
            "weights: to start from its backbone, pass it as init_from (--init-from) instead of "
            "pretrained"
        )
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise PretrainedWeightsError(
            f"{path} holds a {type(state).__name__}, not a state dict: {accepted}"
        )
    return state


def _load_into(
    name: str, model: nn.Module, body: nn.Module, state: dict[str, Tensor], source: str
) -> None:
    """Load ``state`` into the full model, or else into the truncated body; strict either way."""
    targets = {"the torchvision model": model, "the backbone": body}
    if model is body:
        targets = {"the backbone": body}
    for target in targets.values():
        try:
            target.load_state_dict(state, strict=True)
            log.info("loaded %s weights for %s", source, name)
            return
        except RuntimeError:
            continue
    why = "; ".join(f"as {what}: {_misfit(target, state)}" for what, target in targets.items())
    raise PretrainedWeightsError(f"weights from {source} do not fit backbone {name!r} ({why})")


def _misfit(target: nn.Module, state: dict[str, Tensor]) -> str:
    """How ``state`` differs from ``target``'s own state dict, in a few words: the entries it
    lacks, those ``target`` does not have, and those of another shape (the first of each)."""
    own = target.state_dict()
    missing = [key for key in own if key not in state]
    extra = [key for key in state if key not in own]
    shapes = [
        f"{key} is {tuple(state[key].shape)}, not {tuple(own[key].shape)}"
        for key in own
        if key in state
        and isinstance(state[key], Tensor)
        and tuple(state[key].shape) != tuple(own[key].shape)
    ]
    others = [key for key in own if key in state and not isinstance(state[key], Tensor)]
    parts = []
    if missing:
        parts.append(f"{len(missing)} of its {len(own)} entries missing (first {missing[0]!r})")
    if extra:
        parts.append(f"{len(extra)} entries it does not have (first {extra[0]!r})")
    if shapes:
        parts.append(f"{len(shapes)} of another shape (first: {shapes[0]})")
    if others:
        parts.append(f"{len(others)} that are not tensors (first {others[0]!r})")
    return ", ".join(parts) or "its entries do not load"


@torch.no_grad()
def _adapt_first_conv(body: nn.Module, in_channels: int) -> None:
    """Replace the first Conv2d by one taking ``in_channels``, keeping its filters' response."""
    parent, attr, conv = _first_conv(body)
    padding = conv.padding if isinstance(conv.padding, str) else _pair(conv.padding)
    new = nn.Conv2d(
        in_channels,
        conv.out_channels,
        _pair(conv.kernel_size),
        _pair(conv.stride),
        padding,
        _pair(conv.dilation),
        conv.groups,
        conv.bias is not None,
        conv.padding_mode,
    )
    w = conv.weight  # (out, cin, k, k)
    if in_channels == 1:
        new.weight.copy_(w.sum(dim=1, keepdim=True))
    else:
        reps = -(-in_channels // w.shape[1])
        new.weight.copy_(w.repeat(1, reps, 1, 1)[:, :in_channels] * w.shape[1] / in_channels)
    if conv.bias is not None and new.bias is not None:
        new.bias.copy_(conv.bias)
    setattr(parent, attr, new)


def _pair(values: tuple[int, ...]) -> tuple[int, int]:
    """A Conv2d's size, stride or dilation (two numbers: height, width)."""
    height, width = values
    return height, width


def _first_conv(module: nn.Module) -> tuple[nn.Module, str, nn.Conv2d]:
    for parent in module.modules():
        for attr, child in parent.named_children():
            if isinstance(child, nn.Conv2d):
                return parent, attr, child
    raise ValueError("backbone has no Conv2d layer")
