"""VGG-D's own first-order head: the last max-pool and the fully-connected fc6 and fc7."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from training.heads.base import Head
from training.second_order import check_feature_map

__all__ = ["VGGClassifierHead"]


class VGGClassifierHead(Head):
    """The paper's first-order VGG-D baseline: all of VGG-16 after conv5_3 but the classifier.

    ``max-pool 2x2 -> adaptive average pool to pool x pool -> fc6 -> ReLU -> dropout -> fc7 -> ReLU
    -> dropout``: ``(B, 512, h, w)`` -> ``(B, hidden)``, 4,096-d for the paper. With ImageNet (or
    local) weights, fc6 and fc7 start from torchvision's ``classifier.0`` and ``classifier.3``.
    """

    def __init__(
        self, in_channels: int, hidden: int = 4096, pool: int = 7, dropout: float = 0.5
    ) -> None:
        super().__init__(in_channels, hidden)
        self.pooling = nn.Sequential(nn.MaxPool2d(2, 2, ceil_mode=True), nn.AdaptiveAvgPool2d(pool))
        self.fc = nn.Sequential(
            nn.Linear(in_channels * pool * pool, hidden),
            nn.ReLU(True),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(True),
            nn.Dropout(dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        """First-order, so it runs under the caller's autocast, unlike the second-order heads."""
        check_feature_map(x, self.in_channels, type(self).__name__)
        return self.pool(x)

    def pool(self, x: Tensor) -> Tensor:
        return self.fc(self.pooling(x).flatten(1))  # (B, c pool^2) -> (B, hidden)

    @torch.no_grad()
    def load_torchvision_classifier(self, state: Mapping[str, Tensor]) -> None:
        """Copy fc6 and fc7 from a torchvision VGG-16 state dict (``classifier.0``, ``.3``).

        A state without them (a backbone-only weights file) leaves the Glorot-initialised layers.
        """
        if "classifier.0.weight" not in state:
            return
        for index, key in ((0, "classifier.0"), (3, "classifier.3")):
            layer = self.fc[index]
            assert isinstance(layer, nn.Linear)
            layer.weight.copy_(state[f"{key}.weight"])
            layer.bias.copy_(state[f"{key}.bias"])
