"""The second-order network: backbone -> 1x1 conv -> BatchNorm -> head -> linear classifier.

``forward_features``: image ``(B, C_in, H, W)`` -> feature map ``(B, c, h, w)`` (backbone, then the
linear 1x1 reduction to ``c`` and BatchNorm, paper Sec. 4.1: no ReLU, so the features stay close to
Gaussian). ``forward_head``: feature map -> ``(logits (B, K), embedding (B, head.output_dim))``.
The embedding is what ``/embed`` serves and the logits what ``/classify`` serves.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from training.backbones import backbone_spec, create_backbone, pretrained_state
from training.heads import create_head, head_spec

__all__ = ["ModelConfig", "ModelOutput", "SecondOrderNet", "build_model"]


@dataclass(frozen=True)
class ModelConfig:
    """Everything that rebuilds a model's architecture; stored in every checkpoint."""

    num_classes: int  # K, classes of the classifier
    backbone: str = "resnet50"  # key of training.backbones.BACKBONES
    head: str = "smso"  # key of training.heads.HEADS
    head_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"dim": 64} for smso
    reduce_dim: int | None = 256  # c of the 1x1 conv + BN after the backbone; None: no reduction
    in_channels: int | None = None  # image channels; None: the backbone's own (3, or 1)
    pretrained: str | None = None  # "imagenet", a weights file, or None; used at first build only

    def __post_init__(self) -> None:
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {self.num_classes}")
        backbone_spec(self.backbone)  # raise on unknown names, listing the valid ones
        head_spec(self.head)
        if self.reduce_dim is not None and self.reduce_dim < 1:
            raise ValueError(f"reduce_dim must be >= 1 or None, got {self.reduce_dim}")
        object.__setattr__(self, "head_options", dict(self.head_options))

    @classmethod
    def for_paper(cls, backbone: str, head: str, num_classes: int, **overrides: Any) -> ModelConfig:
        """The paper's setting for ``head``: c = 512 for BP, DeepO2P and CBP, else 256; no
        reduction for the first-order head, which pools the backbone's own features."""
        reduce_dim = head_spec(head).paper_channels
        fields: dict[str, Any] = {"reduce_dim": reduce_dim, **overrides}
        return cls(num_classes=num_classes, backbone=backbone, head=head, **fields)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-safe) for checkpoints and run configs."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of ``to_dict``; unknown keys raise ``TypeError`` naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TypeError(f"unknown model config keys: {', '.join(unknown)}")
        return cls(**data)


class ModelOutput(NamedTuple):
    """What ``SecondOrderNet.forward`` returns."""

    logits: Tensor  # (B, K)
    embedding: Tensor  # (B, head.output_dim)


class SecondOrderNet(nn.Module):
    """Backbone -> [1x1 conv to c (no bias) -> BatchNorm] -> head -> [linear classifier].

    Shapes: image ``(B, C_in, H, W)`` -> feature map ``(B, c, H/s, W/s)`` -> embedding
    ``(B, D)`` -> logits ``(B, K)``, with ``s`` the backbone's stride, ``D = head.output_dim``.
    Heads whose spec says they score the classes themselves (LRBP) have no classifier: their
    output is both.
    New layers (1x1 conv, head projections, classifier) get Glorot-normal weights.
    """

    def __init__(self, config: ModelConfig, load_pretrained: bool = True) -> None:
        super().__init__()
        self.config = config
        pretrained = config.pretrained if load_pretrained else None
        state = None if pretrained is None else pretrained_state(config.backbone, pretrained)
        self.backbone = create_backbone(config.backbone, pretrained, config.in_channels, state)
        channels = self.backbone.out_channels
        if config.reduce_dim is None:
            self.reduce: nn.Module = nn.Identity()
        else:
            conv = nn.Conv2d(channels, config.reduce_dim, kernel_size=1, bias=False)
            nn.init.xavier_normal_(conv.weight)
            self.reduce = nn.Sequential(conv, nn.BatchNorm2d(config.reduce_dim))
            channels = config.reduce_dim
        spec = head_spec(config.head)
        options = dict(config.head_options)
        if spec.needs_num_classes:
            options.setdefault("num_classes", config.num_classes)
        self.head = create_head(config.head, channels, **options)
        if spec.load_pretrained is not None and state is not None:
            spec.load_pretrained(self.head, state)  # VGG-D's fc6 and fc7
        self.embedding_dim: int = self.head.output_dim
        if spec.scores_classes:
            if self.head.output_dim != config.num_classes:
                raise ValueError(
                    f"head {config.head!r} scores {self.head.output_dim} classes, "
                    f"config says {config.num_classes}"
                )
            self.classifier: nn.Module = nn.Identity()
        else:
            linear = nn.Linear(self.embedding_dim, config.num_classes)
            nn.init.xavier_normal_(linear.weight)
            nn.init.zeros_(linear.bias)
            self.classifier = linear

    def forward_features(self, images: Tensor) -> Tensor:
        """``(B, C_in, H, W)`` -> ``(B, c, h, w)``, the head's input."""
        return self.reduce(self.backbone(images))

    def forward_head(self, features: Tensor) -> ModelOutput:
        """``(B, c, h, w)`` -> ``(logits (B, K), embedding (B, D))``, in float32."""
        embedding = self.head(features)
        with torch.autocast(device_type=embedding.device.type, enabled=False):
            logits = self.classifier(embedding)
        return ModelOutput(logits, embedding)

    def forward(self, images: Tensor) -> ModelOutput:
        """``(B, C_in, H, W)`` -> ``(logits (B, K), embedding (B, D))``."""
        return self.forward_head(self.forward_features(images))


def build_model(config: ModelConfig, load_pretrained: bool = True) -> SecondOrderNet:
    """Build the model ``config`` describes (pretrained backbone weights on request)."""
    return SecondOrderNet(config, load_pretrained=load_pretrained)
