"""First-order baseline: global average pooling."""

from __future__ import annotations

from torch import Tensor

from training.heads.base import Head

__all__ = ["GlobalAvgPool"]


class GlobalAvgPool(Head):
    """Global average pooling, ``z = 1/n sum_i x_i``: ``(B, c, h, w)`` -> ``(B, c)``.

    With ResNet-50 features (c = 2,048) this is the paper's first-order ResNet baseline.
    """

    def __init__(self, in_channels: int) -> None:
        super().__init__(in_channels, in_channels)

    def pool(self, x: Tensor) -> Tensor:
        return x.mean(dim=(2, 3))
